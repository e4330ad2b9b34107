#!/usr/bin/env python3
"""Writes a one-layer OCI image archive from local files: no daemon, no base image, no network.

  python3 testbed/oci_image.py --out IMAGE.tar --name REPO:TAG [--user UID:GID]
      [--entrypoint PATH] [--env K=V ...] [--label K=V ...] [--dir PATH ...] SRC=DEST[:MODE] ...

The archive is an OCI image layout in a tar (what `podman load`, `skopeo copy oci-archive:` and
`ctr images import` read). Its one layer holds each SRC at the absolute path DEST (mode MODE in
octal, default SRC's own), the directories above them, and the empty directories given by --dir.
Every entry is owned by root with time 0, so the same files give the same digest.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from pathlib import Path, PurePosixPath

EPOCH = "1970-01-01T00:00:00Z"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


class Entry:
    def __init__(self, spec: str):
        src, sep, rest = spec.partition("=")
        if not sep or not src or not rest:
            raise argparse.ArgumentTypeError(f"{spec!r}: want SRC=DEST[:MODE], e.g. target/modelserve=/usr/local/bin/modelserve")
        dest, _, mode = rest.partition(":")
        self.src = Path(src)
        self.dest = PurePosixPath(dest)
        if not self.dest.is_absolute() or ".." in self.dest.parts:
            raise argparse.ArgumentTypeError(f"{spec!r}: DEST {dest!r} must be an absolute path without '..'")
        try:
            self.mode = int(mode, 8) if mode else None
        except ValueError:
            raise argparse.ArgumentTypeError(f"{spec!r}: MODE {mode!r} is not octal, e.g. 0755") from None


def pair(spec: str) -> tuple[str, str]:
    k, sep, v = spec.partition("=")
    if not sep or not k:
        raise argparse.ArgumentTypeError(f"{spec!r}: want KEY=VALUE")
    return k, v


def layer(entries: list[Entry], dirs: list[str]) -> bytes:
    """The uncompressed layer tar, entries sorted by path, parents first."""
    wanted: set[PurePosixPath] = {PurePosixPath(d) for d in dirs}
    for e in entries:
        wanted.update(e.dest.parents)
    for d in list(wanted):
        wanted.update(d.parents)
    wanted.discard(PurePosixPath("/"))
    files = {e.dest: e for e in entries}
    if len(files) != len(entries):
        sys.exit("oci_image: two files have the same DEST")
    clash = set(files) & wanted
    if clash:
        sys.exit(f"oci_image: {sorted(map(str, clash))[0]} is both a file and a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(wanted | set(files), key=lambda p: p.parts):
            info = tarfile.TarInfo(str(path).lstrip("/"))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path in files:
                e = files[path]
                st = e.src.stat()  # follows links: the image gets the file's content under DEST
                if not stat.S_ISREG(st.st_mode):
                    sys.exit(f"oci_image: {e.src} is not a regular file")
                info.size = st.st_size
                info.mode = e.mode if e.mode is not None else stat.S_IMODE(st.st_mode)
                with open(e.src, "rb") as f:
                    tar.addfile(info, f)
            else:
                info.type = tarfile.DIRTYPE
                info.mode = 0o1777 if path == PurePosixPath("/tmp") else 0o755
                tar.addfile(info)
    return buf.getvalue()


def blob(tar: tarfile.TarFile, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Entry, metavar="SRC=DEST[:MODE]")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", required=True, help="the image's name, REPOSITORY:TAG")
    ap.add_argument("--user", default="", help="UID:GID the container runs as (default root)")
    ap.add_argument("--entrypoint", action="append", default=[], help="entrypoint argv, once per word")
    ap.add_argument("--env", type=pair, action="append", default=[])
    ap.add_argument("--label", type=pair, action="append", default=[])
    ap.add_argument("--dir", action="append", default=[], help="an empty directory, e.g. /tmp")
    ap.add_argument("--arch", default=ARCH.get(os.uname().machine, os.uname().machine))
    args = ap.parse_args()
    repo, sep, tag = args.name.rpartition(":")
    if not sep or not repo or not tag or "/" in tag:
        sys.exit(f"oci_image: --name {args.name!r}: want REPOSITORY:TAG, e.g. localhost/llama.cpp:server-b11312")

    raw = layer(args.files, args.dir)
    packed = gzip.compress(raw, compresslevel=6, mtime=0)
    config = {
        "created": EPOCH,
        "architecture": args.arch,
        "os": "linux",
        "config": {k: v for k, v in {
            "User": args.user,
            "Entrypoint": args.entrypoint,
            "Env": [f"{k}={v}" for k, v in args.env],
            "Labels": dict(args.label),
            "WorkingDir": "/",
        }.items() if v},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
        "history": [{"created": EPOCH, "created_by": "testbed/oci_image.py"}],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    part = args.out.with_name(args.out.name + ".part")
    with tarfile.open(part, "w") as tar:
        layer_desc = blob(tar, packed)
        config_desc = blob(tar, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = blob(tar, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
                # both the full reference: ctr reads the first, podman the second
                "annotations": {"io.containerd.image.name": args.name, "org.opencontainers.image.ref.name": args.name},
            }],
        }
        for name, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps(index, sort_keys=True).encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    part.replace(args.out)
    print(f"oci_image: {args.name} ({manifest_desc['digest']}, layer {len(packed) / 2**20:.1f} MiB "
          f"compressed, {len(raw) / 2**20:.1f} MiB unpacked) in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
