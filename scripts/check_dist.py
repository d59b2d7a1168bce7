"""Check the sdist and the wheel of ``dist/`` hold what a release must ship (``scripts/release``).

Every file git tracks under ``pgbus_workflows/`` (modules, migrations, templates, static files,
``py.typed``) must be in the wheel and in the sdist; the sdist must also hold what a packager
needs to build it again (``pyproject.toml``, ``README.md``, ``LICENSE``, ``CHANGELOG.md``).
"""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

SDIST_EXTRAS = ["pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"]


def tracked_package_files() -> list[str]:
    """The files git tracks in the package, as paths from the repository's top."""
    listed = subprocess.run(["git", "ls-files", "pgbus_workflows"], capture_output=True, text=True, check=True)
    return [line for line in listed.stdout.splitlines() if line]


def main(dist: Path) -> int:
    """Print what is missing from either archive and return 1, or return 0."""
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}", file=sys.stderr)
        return 1
    package = tracked_package_files()
    in_wheel = set(zipfile.ZipFile(wheels[0]).namelist())
    with tarfile.open(sdists[0]) as archive:  # members are "<name>-<version>/<path>"
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    missing = [f"wheel: {path}" for path in package if path not in in_wheel]
    missing += [f"sdist: {path}" for path in package + SDIST_EXTRAS if path not in in_sdist]
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in in_wheel):
        missing.append("wheel: the LICENSE in its .dist-info")
    for line in missing:
        print(f"missing from the {line}", file=sys.stderr)
    if not missing:
        print(f"{wheels[0].name} and {sdists[0].name} hold the {len(package)} files of the package")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "dist")))
