"""The PEP 517 build backend of kairos_client: setuptools, run on a copy of the sources.

A build writes nothing into the source tree (a read-only checkout builds; `pip install
./clients/python` leaves no `build/`, `*.egg-info` or generated stubs behind): each hook copies
the package and the repository's `proto/` into a temporary directory, where setup.py generates
the gRPC stubs into the package and setuptools builds. The wheel (and sdist) carry the stubs and
the protos, so a wheel built once installs anywhere without the repository.
"""

import os
import pathlib
import shutil
import tempfile

from setuptools import build_meta as _setuptools

HERE = pathlib.Path(__file__).resolve().parent.parent
#: What of clients/python a build uses.
_SOURCES = ("kairos_client", "build_backend", "setup.py", "pyproject.toml", "README.md", "MANIFEST.in")


def _proto_dir() -> pathlib.Path:
    found = os.environ.get("KAIROS_PROTO_DIR")
    for candidate in ([pathlib.Path(found)] if found else []) + [HERE / "proto", HERE.parent.parent / "proto"]:
        if (candidate / "kairos" / "v1").is_dir():
            return candidate
    raise SystemExit(
        "kairos_client: no kairos/v1/*.proto found (build from the kairos repository: "
        "pip install ./clients/python, or set KAIROS_PROTO_DIR)"
    )


def _copy(into: pathlib.Path) -> pathlib.Path:
    """The package's sources and the protos, copied under `into`; returns the copy's root."""
    root = into / "src"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_pb", "build", "*.egg-info")
    for name in _SOURCES:
        path = HERE / name
        if path.is_dir():
            shutil.copytree(path, root / name, ignore=ignore)
        elif path.exists():
            shutil.copy2(path, root / name)
    shutil.copytree(_proto_dir(), root / "proto", ignore=shutil.ignore_patterns("*.rs"))
    return root


def _in_copy(hook, out_dir: str, *args):
    """Runs setuptools' `hook` in a copy of the sources, writing its result to `out_dir`."""
    out = str(pathlib.Path(out_dir).resolve())
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="kairos-client-build-") as tmp:
        root = _copy(pathlib.Path(tmp))
        os.chdir(root)
        try:
            return hook(out, *args)
        finally:
            os.chdir(before)


def get_requires_for_build_wheel(config_settings=None):
    # The static build requirements (pyproject.toml) are all it needs.
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _in_copy(_setuptools.build_wheel, wheel_directory, config_settings)


def build_sdist(sdist_directory, config_settings=None):
    return _in_copy(_setuptools.build_sdist, sdist_directory, config_settings)
