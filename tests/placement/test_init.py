"""The core package: pure Python that imports no Django, no numpy, nothing of the project."""

import subprocess
import sys


def test_importing_the_core_loads_no_django_no_numpy_and_no_other_app():
    probe = (
        "import sys, placement; "
        "loaded = {m.split('.')[0] for m in sys.modules}; "
        "print(sorted(loaded & {'django', 'numpy', 'pools', 'nodes', 'leases', 'jobs', 'config'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
