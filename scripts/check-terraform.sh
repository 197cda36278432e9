#!/usr/bin/env bash
# Checks the Terraform burst module: every .tf file parses (python-hcl2), and checkov finds no
# failed check (a deliberate skip carries its reason inline). The tools live apart from the test
# suite's Python packages (checkov pins botocore versions moto does not want): in a virtual
# environment under target/, or, where Python has no venv module, a --target directory.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=target/tools
venv=$tools/tf-check
lib=$tools/tf-check-lib
packages=('checkov>=3,<4' 'python-hcl2>=4,<8')
py=()
if [ -z "${KAIROS_TF_CHECK_NO_VENV:-}" ] && { [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1; }; then
  if ! "$venv/bin/python" -c 'import checkov, hcl2' >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
  fi
  py=("$venv/bin/python")
else
  if ! PYTHONPATH="$lib" python3 -c 'import checkov, hcl2' >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$lib" "${packages[@]}"
  fi
  export PYTHONPATH="$lib"
  py=(python3)
fi

"${py[@]}" - <<'PY'
import pathlib, sys
import hcl2
files = sorted(pathlib.Path("deploy/terraform").rglob("*.tf"))
if not files:
    sys.exit("check-terraform: no .tf files found")
for f in files:
    with f.open() as fh:
        hcl2.load(fh)
print(f"check-terraform: {len(files)} files parse")

# What the module promises beyond checkov's generic checks (each broke once):
with open("deploy/terraform/burst/main.tf") as fh:
    main = hcl2.load(fh)
def strings(x):
    """Every string inside x (python-hcl2 versions nest values in lists differently)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from strings(v)
docs = {k: v for d in main["data"] for k, v in d.get("aws_iam_policy_document", {}).items()}
actions = [a for st in docs["controller"]["statement"] for a in strings(st.get("actions", []))]
problems = []
if "ec2:DescribeInstanceAttribute" in actions:
    problems.append("the controller role may read any instance's user-data (DescribeInstanceAttribute)")
if "ec2:DescribeInstanceTypes" not in actions:
    problems.append("the controller role cannot check instance types (DescribeInstanceTypes)")
assume = list(strings(docs["controller_assume"]))
if not {"Service", "AWS"} <= set(assume):
    problems.append("controller_role_principals: ARN principals are not passed (Service and AWS blocks)")
groups = {k: v for r in main["resource"] for k, v in r.get("aws_security_group", {}).items()}
if not any("agent_port" in v for v in strings(groups["burst_node"].get("ingress", []))):
    problems.append("the burst security group does not let controllers reach the agent port")
if problems:
    sys.exit("check-terraform: " + "; ".join(problems))
print("check-terraform: module promises hold")
PY

# --skip-download: no calls to the vendor's platform (CI reaches only package registries).
"${py[@]}" -W ignore::SyntaxWarning -c 'import sys; from checkov.main import Checkov; sys.argv[0] = "checkov"; sys.exit(Checkov().run())' \
  --quiet --compact --skip-download --framework terraform -d deploy/terraform/burst --skip-path examples
echo "check-terraform: checkov passed"
