"""The CSS toolkit vendored under static/vendor/<name>-<version>/ (docs/console.md, "The design system") is the package
pinned in tests/vendor/package-lock.json, byte for byte.

`npm ci --prefix tests/vendor` (the Makefile's test prerequisite) downloads the package's tarball and refuses it unless
it matches the lock's `integrity` hash; this module then checks that the lock pins the version the directory is named
after, that npm installed that very version, and that every vendored file is identical to the installed package's file
at the same path under its `dist/` (or its root, for the licence). Node is needed for this check only, never to run the
console: without npm's install it skips through `missing_service` (a failure under REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tests.conftest import missing_service

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "static" / "vendor"
LOCK = Path(__file__).resolve().parent / "vendor" / "package-lock.json"
INSTALLED = LOCK.parent / "node_modules"
NAMED = re.compile(r"^(?P<name>[a-z0-9-]+)-(?P<version>\d+\.\d+\.\d+)$")


def vendored() -> list[Path]:
    return sorted(p for p in VENDOR.iterdir() if p.is_dir())


def locked() -> dict:
    return json.loads(LOCK.read_text())["packages"]


def test_each_vendored_directory_is_named_after_the_locked_version():
    folders = vendored()
    assert folders, "nothing vendored under static/vendor/"
    packages = locked()
    for folder in folders:
        named = NAMED.match(folder.name)
        assert named, f"{folder.name}: name it <package>-<version>"
        entry = packages.get(f"node_modules/{named['name']}")
        assert entry, f"{named['name']} is not in {LOCK.relative_to(ROOT)}"
        assert entry["version"] == named["version"], (folder.name, entry["version"])
        assert entry["integrity"].startswith("sha512-"), entry  # what npm ci checks the tarball against
    direct = locked()[""]["dependencies"]
    assert sorted(direct) == sorted(NAMED.match(f.name)["name"] for f in folders), direct


def test_every_vendored_file_is_the_verified_package_file():
    if not (INSTALLED / ".installed").exists():
        missing_service("needs the vendored toolkit's package: npm ci --prefix tests/vendor --omit=peer")
    for folder in vendored():
        named = NAMED.match(folder.name)
        package = INSTALLED / named["name"]
        installed = json.loads((package / "package.json").read_text())
        assert installed["version"] == named["version"], (folder.name, installed["version"])
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        assert files, folder
        for path in files:
            relative = path.relative_to(folder)
            source = package / "dist" / relative
            if not source.exists():
                source = package / relative  # the licence sits at the package's root
            assert source.is_file(), f"{path.relative_to(ROOT)} is not a file of {named['name']} {named['version']}"
            vendored_hash = hashlib.sha256(path.read_bytes()).hexdigest()
            assert vendored_hash == hashlib.sha256(source.read_bytes()).hexdigest(), (
                f"{path.relative_to(ROOT)} differs from {source.relative_to(INSTALLED)}: copy it again from the "
                "verified package (docs/console.md, upgrading the toolkit)"
            )


def test_the_console_links_the_vendored_stylesheet_and_no_cdn():
    head = (ROOT / "templates" / "console" / "base.html").read_text().split("<body")[0]
    assert f"vendor/{vendored()[0].name}/css/bootstrap.min.css" in head
    assert "https://" not in head and "//cdn" not in head
