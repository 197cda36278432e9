#!/usr/bin/env bash
# Checks the Terraform burst module: every .tf file parses (python-hcl2), and checkov finds no
# failed check (a deliberate skip carries its reason inline). The tools live in their own
# virtual environment under target/, apart from the test suite's Python packages.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/tools/tf-check
if [ ! -x "$venv/bin/checkov" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'checkov>=3,<4' 'python-hcl2>=4,<8'
fi

"$venv/bin/python" - <<'PY'
import pathlib, sys
import hcl2
files = sorted(pathlib.Path("deploy/terraform").rglob("*.tf"))
if not files:
    sys.exit("check-terraform: no .tf files found")
for f in files:
    with f.open() as fh:
        hcl2.load(fh)
print(f"check-terraform: {len(files)} files parse")
PY

# --skip-download: no calls to the vendor's platform (CI reaches only package registries).
"$venv/bin/checkov" --quiet --compact --skip-download --framework terraform -d deploy/terraform/burst --skip-path examples
echo "check-terraform: checkov passed"
