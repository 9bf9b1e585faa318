"""Pack the Python environment an interpreter runs in into one relocatable tar archive, cached while it is unchanged.

``hpctrain submit`` runs it on the login node with the job's own interpreter, before a job that stages its
environment (``staging.environment: archive``) is submitted::

    PYTHON -m hpctrain.submission.envpack --cache DIR --name KEY

The archive holds the interpreter and its standard library (``base/``; a conda prefix whole), the venv's
packages with editable installs copied in (``venv/``, its ``bin/python`` a relative link into ``base/``) and
libpython where the interpreter links it (``libpython/``): unpacked anywhere, ``venv/bin/python`` runs without
reading a file outside it once the staging step has written ``venv/pyvenv.cfg``'s ``home``. Standard library
only: the job's Python may have nothing but hpctrain's base install. Layout and cache: docs/scaling.md, "Staging".
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import stat
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.files import atomic_path
from hpctrain.submission.module_probe import import_location

# Bumped when the archive's layout changes: an old cache entry is then never reused.
LAYOUT = 1
KEEP = 2  # archives of one environment kept in the cache (a job that started before a repack still reads its own)
# Bytecode caches go into the archive but not into its hash: an import rewrites them (an editable source tree's
# would otherwise give a new hash at every submission), and Python checks each against its source anyway.
_UNHASHED_DIR = f"{os.sep}__pycache__{os.sep}"


@dataclass
class Layout:
    """What goes into the archive: (path on this machine, name in the archive) pairs, and the few synthetic files."""

    files: list[tuple[str, str]] = field(default_factory=list)  # directories are walked
    links: dict[str, str] = field(default_factory=dict)  # archive name -> link target (relative)
    texts: dict[str, str] = field(default_factory=dict)  # archive name -> file content
    skip: set[str] = field(default_factory=set)  # real paths left out (editable-install hooks, the venv's own links)


def _python_name() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def _base_executable() -> str:
    """The real interpreter binary (a venv's bin/python is a link to it, or a copy of it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base)


def _pyvenv_cfg(prefix: str) -> dict[str, str]:
    path = os.path.join(prefix, "pyvenv.cfg")
    values: dict[str, str] = {}
    if os.path.isfile(path):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
    return values


def _editable_packages(site_packages: str) -> tuple[dict[str, str], set[str]]:
    """{top-level package: its source directory} of editable installs, and the hook files that point at them."""
    packages: dict[str, str] = {}
    hooks: set[str] = set()
    if not os.path.isdir(site_packages):
        return packages, hooks
    for entry in sorted(os.listdir(site_packages)):
        info = os.path.join(site_packages, entry)
        url = os.path.join(info, "direct_url.json")
        if not entry.endswith(".dist-info") or not os.path.isfile(url):
            continue
        try:
            editable = json.loads(Path(url).read_text(encoding="utf-8")).get("dir_info", {}).get("editable", False)
        except ValueError:
            continue
        if not editable:
            continue
        record = os.path.join(info, "RECORD")
        if os.path.isfile(record):
            for line in Path(record).read_text(encoding="utf-8").splitlines():
                name = line.split(",", 1)[0]
                if name.startswith(("__editable__", "__pycache__/__editable__")) or (
                        name.endswith(".pth") and "/" not in name):
                    hooks.add(os.path.normpath(os.path.join(site_packages, name)))
        top = os.path.join(info, "top_level.txt")
        names = Path(top).read_text(encoding="utf-8").split() if os.path.isfile(top) else []
        for name in names:
            source = import_location(name)
            if source is not None:
                packages[name] = source
    return packages, hooks


def layout() -> Layout:
    """The archive's content for the environment this interpreter runs in."""
    out = Layout()
    py = _python_name()
    base, prefix = os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)
    in_venv = base != prefix
    cfg = _pyvenv_cfg(prefix) if in_venv else {}
    system_site = (not in_venv) or cfg.get("include-system-site-packages", "false").lower() == "true"
    conda = os.path.isdir(os.path.join(base, "conda-meta"))
    executable = _base_executable()

    # base/: the interpreter and its standard library, at the same places relative to base/ as to the base prefix
    # (Python finds its prefix from the executable by looking for lib/pythonX.Y/os.py above it).
    out.files.append((executable, f"base/bin/{py}"))
    if conda:
        out.files.append((base, "base"))
        out.skip.add(os.path.join(base, "pkgs"))
    else:
        paths = sysconfig.get_paths(vars={"base": base, "platbase": base, "installed_base": base,
                                          "installed_platbase": base})
        for key in ("stdlib", "platstdlib"):
            std = os.path.realpath(paths[key])
            if std.startswith(base + os.sep) and (std, f"base/{os.path.relpath(std, base)}") not in out.files:
                out.files.append((std, f"base/{os.path.relpath(std, base)}"))
                out.skip.add(os.path.join(std, "test"))  # CPython's own test suite: 100 MB no job imports
                if not system_site:
                    out.skip.update({os.path.join(std, "site-packages"), os.path.join(std, "dist-packages")})
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        libdir = sysconfig.get_config_var("LIBDIR") or os.path.join(base, "lib")
        library = os.path.join(libdir, soname) if soname else ""
        if library and os.path.isfile(library):
            out.files.append((os.path.realpath(library), f"libpython/{soname}"))

    # venv/: the environment's own packages, or an empty venv over the base when the interpreter is not in one.
    if in_venv:
        out.files.append((prefix, "venv"))
        for name in os.listdir(os.path.join(prefix, "bin")) if os.path.isdir(os.path.join(prefix, "bin")) else []:
            if name == "python" or name.startswith("python3"):
                out.skip.add(os.path.join(prefix, "bin", name))
        out.skip.add(os.path.join(prefix, "pyvenv.cfg"))
        site = os.path.join(prefix, "lib", py, "site-packages")
        packages, hooks = _editable_packages(site)
        out.skip.update(hooks)
        for name, source in packages.items():
            target = f"venv/lib/{py}/site-packages/{name}" + ("" if os.path.isdir(source) else ".py")
            out.files.append((os.path.realpath(source), target))
    else:
        out.texts[f"venv/lib/{py}/site-packages/.keep"] = ""
    for name in ("python", "python3", py):
        out.links[f"venv/bin/{name}"] = f"../../base/bin/{py}"
    version = ".".join(map(str, sys.version_info[:3]))
    # home is written on each node by the staging step, which knows where the archive was unpacked.
    out.texts["venv/pyvenv.cfg"] = (f"include-system-site-packages = {'true' if system_site else 'false'}\n"
                                    f"version = {version}\n")
    return out


def entries(plan: Layout) -> Iterator[tuple[str, str]]:
    """Every (real path, archive name) the archive holds, files and directories, in a stable order."""
    for real, arc in plan.files:
        if real in plan.skip:
            continue
        yield real, arc
        if os.path.isdir(real) and not os.path.islink(real):
            for root, dirs, names in os.walk(real):
                dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in plan.skip)
                rel = os.path.relpath(root, real)
                for d in dirs:
                    yield os.path.join(root, d), os.path.normpath(f"{arc}/{rel}/{d}")
                for n in sorted(names):
                    path = os.path.join(root, n)
                    if path not in plan.skip:
                        yield path, os.path.normpath(f"{arc}/{rel}/{n}")


def content_hash(plan: Layout) -> str:
    """A hash of what the archive would hold, from names, sizes and modification times (``stat`` only, no reads):
    any file added, removed, rewritten or touched gives a new hash."""
    digest = hashlib.sha256(f"layout {LAYOUT} {sys.version}\n".encode())
    for real, arc in entries(plan):
        if _UNHASHED_DIR in real + os.sep:
            continue
        st = os.lstat(real)
        # A directory is its name: its entries are hashed themselves (its mtime moves when a cache is written in it).
        stamp = "dir" if stat.S_ISDIR(st.st_mode) else f"{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}"
        digest.update(f"{arc}\0{stamp}\n".encode(errors="surrogateescape"))
    for arc, target in sorted(plan.links.items()):
        digest.update(f"{arc}\0->{target}\n".encode())
    for arc, text in sorted(plan.texts.items()):
        digest.update(f"{arc}\0{text}\n".encode())
    return digest.hexdigest()[:16]


def write_archive(plan: Layout, path: Path) -> int:
    """Write the tar (uncompressed: the nodes unpack it at disk speed); returns the number of members."""
    count = 0
    seen: set[str] = set()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, dereference=False) as tar:
        for real, arc in entries(plan):
            if arc in seen:
                continue
            seen.add(arc)
            tar.add(real, arcname=arc, recursive=False)
            count += 1
        for arc, target in sorted(plan.links.items()):
            info = tarfile.TarInfo(arc)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, int(time.time())
            tar.addfile(info)
            count += 1
        for arc, text in sorted(plan.texts.items()):
            data = text.encode()
            info = tarfile.TarInfo(arc)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
            count += 1
    return count


@dataclass(frozen=True)
class Packed:
    archive: str  # the content-named file
    pointer: str  # CACHE/NAME.tar, the link a rendered script reads
    hash: str
    reused: bool
    bytes: int


def pack(cache: str | os.PathLike[str], name: str) -> Packed:
    """The archive of this interpreter's environment in ``cache``: reused when its content hash is unchanged,
    written (atomically) otherwise; ``cache/NAME.tar`` then points at it and older ones beyond KEEP go."""
    directory = Path(cache)
    directory.mkdir(parents=True, exist_ok=True)
    plan = layout()
    digest = content_hash(plan)
    archive = directory / f"{name}-{digest}.tar"
    reused = archive.is_file()
    if not reused:
        with atomic_path(archive) as tmp:
            write_archive(plan, tmp)
    pointer = directory / f"{name}.tar"
    # A symbolic link is swapped, not written: os.symlink cannot replace a name and a link has no content to fsync.
    link_tmp = directory / f".{name}.tar.{os.getpid()}.link"
    link_tmp.unlink(missing_ok=True)
    os.symlink(archive.name, link_tmp)
    os.replace(link_tmp, pointer)
    _prune(directory, name, keep=archive)
    return Packed(str(archive), str(pointer), digest, reused, archive.stat().st_size)


def _prune(directory: Path, name: str, keep: Path) -> None:
    others = sorted((p for p in directory.glob(f"{name}-*.tar") if p != keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP - 1:]:
        old.unlink(missing_ok=True)


def expand_home(path: str) -> str:
    """``~``, ``$HOME`` or ``${HOME}`` at the start of ``path`` as this user's home (the script's rule)."""
    for prefix in ("${HOME}", "$HOME", "~"):
        if path == prefix or path.startswith(prefix + "/"):
            return os.path.expanduser("~") + path[len(prefix):]
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.submission.envpack", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True, help="shared directory of packed environments")
    parser.add_argument("--name", required=True, help="the environment's name in the cache (its interpreter's key)")
    parser.add_argument("--dry-run", action="store_true", help="print the content hash and what would be packed")
    args = parser.parse_args(argv)
    if "/" in args.name or args.name in ("", ".", ".."):
        parser.error("--name is a plain file name")
    if args.dry_run:
        plan = layout()
        print(json.dumps({"hash": content_hash(plan), "files": [list(f) for f in plan.files]}))
        return 0
    try:
        packed = pack(expand_home(args.cache), args.name)
    except OSError as exc:
        print(f"hpctrain: cannot pack the environment of {sys.executable} into {args.cache}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(packed.__dict__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
