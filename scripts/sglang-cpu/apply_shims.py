"""Make SGLang 0.5.23 importable on a CPU-only venv (run with that venv's python).

1. torchvision from the registry is a CUDA build; installed without its deps, importing it
   fails in the two op-registration imports of its ``__init__`` (``torchvision::nms does
   not exist``). Making those two imports optional keeps the pure-Python transforms that
   SGLang's multimodal processors import.
2. sgl-kernel has no CPU build on the registry: copy the pure-torch ``sgl_kernel`` shim
   next to the installed packages.

Idempotent: a patched file is recognised by its marker and left alone.
"""

from __future__ import annotations

import argparse
import shutil
import sysconfig
from pathlib import Path

MARKER = "# miles-lite cpu shim"

# torchvision 0.28 imports these two modules (which register C++ op kernels) inside its
# ``from torchvision import (...)`` block.
OP_MODULES = ("_autograd_registrations", "_meta_registrations")


def patch_torchvision(site: Path) -> None:
    init = site / "torchvision" / "__init__.py"
    text = init.read_text()
    if MARKER in text:
        return
    guarded = ""
    for name in OP_MODULES:
        line = f"    {name},\n"
        if line not in text:
            raise SystemExit(f"apply_shims: {init} does not import {name} as expected")
        text = text.replace(line, "", 1)
        guarded += (
            f"try:  {MARKER}\n    from torchvision import {name}\n"
            "except RuntimeError:  # operator torchvision::... does not exist (no CPU ops)\n"
            "    pass\n"
        )
    anchor = "from torchvision import (\n"
    if anchor not in text:
        raise SystemExit(f"apply_shims: no 'from torchvision import (' in {init}")
    init.write_text(text.replace(anchor, guarded + anchor, 1))


def install_sgl_kernel(site: Path, source: Path) -> None:
    dest = site / "sgl_kernel"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--sgl-kernel", required=True, type=Path)
    args = parser.parse_args()
    site = Path(sysconfig.get_paths()["purelib"])
    patch_torchvision(site)
    install_sgl_kernel(site, args.sgl_kernel)


if __name__ == "__main__":
    main()
