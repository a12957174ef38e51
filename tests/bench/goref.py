"""Build the Go reference plugin (tests/bench/goref/main.go), cached by source and versions.

On the dependency versions of the e2e tier's oracles (tests/e2e/versions.toml), fetched
through the Go module proxy, built once into ``~/.cache/gpu-dra-e2e/bench-goref-<hash>``.
"""

import hashlib
from pathlib import Path

from tests.e2e import build

SOURCE = Path(__file__).resolve().parent / "goref" / "main.go"


def build_goref() -> Path:
    """The plugin binary's path (built if missing). Raises SystemExit if go fails."""
    version = build.k8s_version(None).replace("v1.", "v0.", 1)
    main = SOURCE.read_text()
    digest = hashlib.sha256(f"{version}\n{main}".encode()).hexdigest()[:12]
    name = f"bench-goref-{digest}"
    out = build.cache_root() / name / "goref"
    if not out.exists():
        requires = {
            "k8s.io/dynamic-resource-allocation": version,
            "k8s.io/api": version,
            "k8s.io/apimachinery": version,
            "k8s.io/client-go": version,
        }
        module = build._simple_module(name, requires, {"cmd/goref": main}, go_line="1.26.0")
        build._build(module, "./cmd/goref", out)
    return out


if __name__ == "__main__":
    print(build_goref())
