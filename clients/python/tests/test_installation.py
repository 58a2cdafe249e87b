"""What an agent gets from `pip install`: the client with requests as its one dependency, typed, knowing which API
versions it speaks. No console needed."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import subprocess
import sys
import unittest

import recovery_client
from recovery_client import SUPPORTED_API, USER_AGENT, IncompatibleConsole, speaks

# requests and what it pulls in: the only modules outside the standard library importing the client may load.
REQUESTS = {"requests", "urllib3", "idna", "certifi", "charset_normalizer"}


class Installation(unittest.TestCase):
    def test_importing_it_loads_nothing_but_the_standard_library_and_requests(self) -> None:
        code = (
            "import sys; before = set(sys.modules)\n"
            "import recovery_client, recovery_client.recovered, recovery_client.runtime\n"
            "new = [m for m in set(sys.modules) - before if getattr(sys.modules[m], '__file__', None)]\n"  # code, not
            "print(' '.join(sorted({m.split('.')[0] for m in new})))"  # an extension's synthetic helper modules
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        loaded = set(done.stdout.split())
        self.assertEqual(loaded - set(sys.stdlib_module_names) - REQUESTS, {"recovery_client"})
        self.assertIn("requests", loaded)

    def test_it_is_the_installed_distribution_with_its_one_dependency_and_its_type_marker(self) -> None:
        try:
            version = importlib.metadata.version("recovery-console-client")
        except importlib.metadata.PackageNotFoundError:
            self.skipTest("recovery-console-client is not installed here (pip install clients/python)")
        self.assertEqual(version, recovery_client.__version__)
        requires = importlib.metadata.requires("recovery-console-client") or []
        self.assertEqual([r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires], ["requests"])
        self.assertTrue((importlib.resources.files("recovery_client") / "py.typed").is_file())

    def test_it_names_itself_and_its_version_to_the_console(self) -> None:
        self.assertTrue(USER_AGENT.startswith(f"recovery-console-client/{recovery_client.__version__} "))

    def test_it_speaks_its_major_from_its_minor_on_and_nothing_else(self) -> None:
        self.assertEqual(SUPPORTED_API, ("1.0", "2.0"))
        spoken = {v: speaks(v) for v in ("1.0", "1.1", "1.42", "2.0", "0.9", "3.1", "1", "1.0.0", "one", "", None)}
        self.assertEqual(
            spoken,
            {
                "1.0": True,
                "1.1": True,
                "1.42": True,
                "2.0": False,
                "0.9": False,
                "3.1": False,
                "1": False,
                "1.0.0": False,
                "one": False,
                "": False,
                None: False,
            },
        )

    def test_an_incompatible_console_says_both_versions(self) -> None:
        other = IncompatibleConsole("0.1.0", "2.0", url="http://console.example")
        self.assertEqual((other.client, other.console, other.oldest_client), ("0.1.0", "2.0", None))
        self.assertIn("0.1.0", str(other))
        self.assertIn("answers API 2.0", str(other))
        dropped = IncompatibleConsole("0.1.0", "1.3", oldest_client="0.4.0")
        self.assertIn("recovery-console-client>=0.4.0", str(dropped))
        self.assertIn("names no Recovery-Api-Version", str(IncompatibleConsole("0.1.0", None)))


if __name__ == "__main__":
    unittest.main()
