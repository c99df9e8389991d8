"""Download a project's sdist from PyPI into DIR and print its path: ``python3 ci/fetch_sdist.py PROJECT VERSION DIR``.

For a project whose kernel files are read from its sdist (flash-attn: no wheel without CUDA). ``pip download
--no-binary :all:`` runs the sdist's setup.py to read its metadata (flash-attn's imports torch, wheel and
packaging, and may try to build), so the file is fetched as the index lists it instead (PyPI's simple API in
JSON, PEP 691: what pip reads) and checked against the sha256 the index publishes. Nothing is built or
installed. A file already in DIR with that digest is kept. Exit status 1 (a line on stderr) when the
release has no sdist, the download fails or the digest differs.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys
import urllib.request


def fetch(project: str, version: str, directory: pathlib.Path) -> pathlib.Path:
    request = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    names = {f"{name}-{version}.tar.gz" for name in (project, project.replace("-", "_"))}
    sdists = [entry for entry in files if entry["filename"] in names]
    if len(sdists) != 1:
        raise SystemExit(f"fetch_sdist: {project}=={version}: the index lists {len(sdists)} sdists, expected one")
    entry = sdists[0]
    path, digest = directory / entry["filename"], entry["hashes"]["sha256"]
    if not (path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest):
        directory.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(entry["url"], timeout=300) as response:
            data = response.read()
        if hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"fetch_sdist: {entry['url']}: sha256 differs from the index's")
        path.write_bytes(data)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.splitlines()[0])
    try:
        print(fetch(sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])))
    except OSError as error:
        raise SystemExit(f"fetch_sdist: {sys.argv[1]}=={sys.argv[2]}: {error}")
