"""Builds kairos_client with gRPC stubs generated from the kairos .proto files.

Run by the build backend (build_backend/kairos_build.py) in a copy of the sources, which holds
the protos as proto/: the stubs are written into that copy's kairos_client/_pb/ with their
imports made package-relative, so they never clash with another package's generated `kairos`
modules. KAIROS_PROTO_DIR overrides where the .proto files are read from.
"""

import os
import pathlib
import re

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent


def proto_dir() -> pathlib.Path:
    found = os.environ.get("KAIROS_PROTO_DIR") or str(HERE / "proto")
    path = pathlib.Path(found)
    if not (path / "kairos" / "v1").is_dir():
        raise SystemExit(
            f"kairos_client: no kairos/v1/*.proto under {path}; build through the package's backend "
            "(pip install ./clients/python) or set KAIROS_PROTO_DIR"
        )
    return path


def generate(out: pathlib.Path) -> None:
    from grpc_tools import protoc

    src = proto_dir()
    protos = sorted(str(p.relative_to(src)) for p in (src / "kairos" / "v1").glob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        ["grpc_tools.protoc", f"-I{src}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}"] + protos
    )
    if code != 0:
        raise SystemExit(f"kairos_client: protoc failed ({code})")
    # `from kairos.v1 import x_pb2` -> `from kairos_client._pb.kairos.v1 import x_pb2`
    for generated in (out / "kairos" / "v1").glob("*.py"):
        text = generated.read_text()
        text = re.sub(r"^from kairos\.v1 import", "from kairos_client._pb.kairos.v1 import", text, flags=re.M)
        generated.write_text(text)
    for package in (out, out / "kairos", out / "kairos" / "v1"):
        (package / "__init__.py").touch()


# Before setup(): the generated packages must exist when setuptools lists them (metadata).
generate(HERE / "kairos_client" / "_pb")

setup(
    packages=["kairos_client", "kairos_client._pb", "kairos_client._pb.kairos", "kairos_client._pb.kairos.v1"],
)
