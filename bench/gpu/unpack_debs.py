"""Unpacks .deb files (ar archives holding data.tar.{xz,gz,zst}) into a root folder with the
standard library only, for machines without dpkg-deb.  usage: unpack_debs.py ROOT DEB..."""
import io
import os
import sys
import tarfile


def members(path):
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise SystemExit(f"unpack_debs: {path} is not a .deb (ar) archive")
        while True:
            head = f.read(60)
            if len(head) < 60:
                return
            name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for deb in sys.argv[2:]:
        for name, data in members(deb):
            if name.startswith("data.tar"):
                if name.endswith(".zst"):
                    raise SystemExit(f"unpack_debs: {deb}: zstd data needs dpkg-deb")
                with tarfile.open(fileobj=io.BytesIO(data)) as t:
                    t.extractall(root, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(root)


if __name__ == "__main__":
    main()
