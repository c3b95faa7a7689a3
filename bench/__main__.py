"""List the benchmarks. Each writes its figures to stdout; docs/performance.md records the latest ones."""

from __future__ import annotations

import pkgutil
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))
    print("benchmarks (run one with: python -m bench.<name>):")
    for name in names:
        print(f"  {name}")


if __name__ == "__main__":
    main()
