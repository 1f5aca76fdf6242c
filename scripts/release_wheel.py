"""Turns the wheel `pip wheel` built into a release wheel, without auditwheel:

- its torch requirement is pinned to the torch it was compiled against (torch==X.Y.*: the C++
  ABI of an extension holds within a torch minor release only);
- its platform tag becomes the manylinux tag a published torch extension uses
  (manylinux_2_28_<arch>, torch's own), or the lowest one its shared objects allow: the tag is
  raised to manylinux_2_<N> when they need glibc 2.<N> > 2.28 (a build on a newer distribution),
  and an explicit --platform-tag that claims less than they need is refused.

    python scripts/release_wheel.py WHEEL [--platform-tag TAG] [--dest-dir DIR]

Prints the path of the release wheel.
"""

from __future__ import annotations

import argparse
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(\w+)$")


def torch_pin() -> str:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


def glibc_needed(root: Path) -> tuple[int, int]:
    """Highest GLIBC_x.y symbol version any shared object under `root` needs."""
    needed = (2, 17)
    for so in root.rglob("*.so*"):
        dump = subprocess.run(["objdump", "-T", str(so)], check=True, capture_output=True,
                              text=True).stdout
        for major, minor in re.findall(r"\bGLIBC_(\d+)\.(\d+)", dump):
            needed = max(needed, (int(major), int(minor)))
    return needed


def platform_tag(requested: str | None, needed: tuple[int, int]) -> str:
    if requested is None:
        glibc = max((2, 28), needed)
        return f"manylinux_{glibc[0]}_{glibc[1]}_{platform.machine()}"
    match = MANYLINUX.match(requested)
    if match and (int(match.group(1)), int(match.group(2))) < needed:
        sys.exit(f"release_wheel: {requested} claims glibc {match.group(1)}.{match.group(2)}, but "
                 f"the extension needs glibc {needed[0]}.{needed[1]} (built on a newer system); "
                 f"build in a manylinux_2_28 container or use manylinux_{needed[0]}_{needed[1]}")
    return requested


def pin_torch(unpacked: Path, pin: str) -> None:
    metadata = next(unpacked.glob("*.dist-info/METADATA"))
    text = metadata.read_text()
    pinned, count = re.subn(r"^Requires-Dist: torch\b[^;\n]*", f"Requires-Dist: {pin}", text,
                            flags=re.M)
    if count != 1:
        sys.exit(f"release_wheel: expected one torch requirement in {metadata}, found {count}")
    metadata.write_text(pinned)


def wheel_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "wheel", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"release_wheel: `wheel {' '.join(args)}` failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--platform-tag", default=None)
    parser.add_argument("--dest-dir", type=Path, default=None)
    args = parser.parse_args()
    dest = (args.dest_dir or args.wheel.parent).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel_cli("unpack", "--dest", str(tmp / "unpacked"), str(args.wheel))
        unpacked = next((tmp / "unpacked").iterdir())
        pin_torch(unpacked, torch_pin())
        tag = platform_tag(args.platform_tag, glibc_needed(unpacked))
        (tmp / "packed").mkdir()
        wheel_cli("pack", "--dest-dir", str(tmp / "packed"), str(unpacked))
        packed = next((tmp / "packed").glob("*.whl"))
        name = wheel_cli("tags", "--remove", "--platform-tag", tag, str(packed)).strip()
        release = dest / Path(name).name
        (packed.parent / Path(name).name).replace(release)
    print(release)


if __name__ == "__main__":
    main()
