"""The scope of MANIFEST.lock (loader/lock.hpp): which lock a command uses, and that no command
runs a plugin file the lock refuses.

The run uses the hook `marked` of constructor_plugin.so (tests/fixtures/constructor_lib.c), whose
library constructor appends a line to $KEEL_TEST_CONSTRUCTOR_MARK: the mark shows whether a file's
code ran. "Replacing" the plugin appends bytes to a copy of it: another SHA-256, the same code.

Usage: test_lock.py KEEL_BINARY SOURCE_ROOT FIXTURE_DIR [unittest args]"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

KEEL, ROOT, FIXTURES = (os.path.abspath(a) for a in sys.argv[1:4])
QUICKSTART = os.path.join(ROOT, "configs", "quickstart.toml")
PLUGIN = os.path.join(FIXTURES, "constructor_plugin.so")

# The quickstart with small data, the marked hook and plugins/ searched first.
MANIFEST = """extends = "{quickstart}"
[run]
output_dir = "{d}/run"
[plugins]
paths = [{paths}]
{extra}
[train]
epochs = 1
[data.train]
limit = 64
[data.test]
limit = 32
[[hooks]]
type = "marked"
"""


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class LockScope(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="keel-lock-")
        self.mark = os.path.join(self.d, "mark")
        self.plugin = self.copy_plugin("plugins")

    def tearDown(self):
        shutil.rmtree(self.d)

    def copy_plugin(self, where, extra=b""):
        os.makedirs(os.path.join(self.d, where), exist_ok=True)
        path = os.path.join(self.d, where, "marked.so")
        shutil.copyfile(PLUGIN, path)
        with open(path, "ab") as f:
            f.write(extra)
        os.chmod(path, 0o644)
        return path

    def manifest(self, name="m.toml", paths=("plugins",), extra=""):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            f.write(MANIFEST.format(quickstart=QUICKSTART, d=self.d, extra=extra,
                                    paths=", ".join(f'"{p}"' for p in paths)))
        return path

    def replace_plugin(self):
        """Another file (another hash) at the locked path; forgets earlier marks."""
        with open(self.plugin, "ab") as f:
            f.write(b"\0replaced")
        if os.path.exists(self.mark):
            os.remove(self.mark)

    def ran(self):
        return os.path.exists(self.mark)

    def keel(self, *args, env=None):
        full = {k: v for k, v in os.environ.items()
                if k not in ("KEEL_LOG_LEVEL", "KEEL_PLUGIN_PATH", "KEEL_ALLOW_WRITABLE_PLUGINS")}
        full["KEEL_TEST_CONSTRUCTOR_MARK"] = self.mark
        full.update(env or {})
        # argv[0] "keel" (keel on PATH): the usage line and the hints name "keel ...".
        p = subprocess.run(["keel", *args], executable=KEEL, capture_output=True, text=True,
                           env=full, cwd=self.d, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def ok(self, *args, env=None):
        rc, out, err = self.keel(*args, env=env)
        self.assertEqual(rc, 0, f"keel {' '.join(args)}: {err}")
        return out

    def one_error(self, args, *parts, rc=1):
        code, _, err = self.keel(*args)
        self.assertEqual(code, rc, err)
        lines = err.strip().splitlines()
        # A wrong argument (exit 2) is followed by the command's usage line.
        self.assertEqual(len(lines), 1 if rc == 1 else 2, err)
        if rc == 2:
            self.assertTrue(lines[1].startswith("usage: keel "), err)
        self.assertTrue(lines[0].startswith("keel: error: "), err)
        self.assertIn("; hint: ", lines[0])
        for part in parts:
            self.assertIn(part, lines[0])
        return lines[0]

    def test_a_symlink_to_the_manifest_runs_under_its_lock(self):
        m = self.manifest()
        link = os.path.join(self.d, "link.toml")
        os.symlink(m, link)
        self.ok("plugins", "lock", m)
        self.replace_plugin()
        self.one_error(("validate", link), m + ".lock: plugin constructor-plugin 1.0.0",
                       "is locked but was not loaded", "differs from",
                       f"keel plugins lock {m} --update constructor-plugin")
        self.assertFalse(self.ran(), "a replaced plugin ran through a symlinked manifest")
        # Locking through the link writes the lock of the file it names.
        os.remove(m + ".lock")
        self.ok("plugins", "lock", link)
        self.assertTrue(os.path.exists(m + ".lock"))
        self.assertFalse(os.path.exists(link + ".lock"))

    def test_a_manifest_runs_under_the_lock_of_the_manifest_it_extends(self):
        m = self.manifest()
        self.ok("plugins", "lock", m)
        child = os.path.join(self.d, "child.toml")
        with open(child, "w") as f:
            f.write('extends = "m.toml"\n[train]\nepochs = 2\n')
        self.ok("validate", child)  # the unchanged plugin loads under m.toml's lock
        self.replace_plugin()
        self.one_error(("validate", child), m + ".lock: plugin constructor-plugin 1.0.0",
                       "differs from")
        self.assertFalse(self.ran(), "a replaced plugin ran through a manifest extending a locked one")
        # Its own lock takes over once written (relocking over the base's needs --update).
        self.one_error(("plugins", "lock", child), "changed since " + m + ".lock pinned plugin "
                       "constructor-plugin", "--update constructor-plugin")
        self.assertFalse(self.ran())
        self.ok("plugins", "lock", child, "--update", "constructor-plugin")
        self.assertTrue(os.path.exists(child + ".lock"))
        self.ok("validate", child)

    def test_locked_true_makes_a_missing_lock_an_error(self):
        m = self.manifest(extra="locked = true")
        line = self.one_error(("validate", m), "plugins.locked = true, but there is no lock",
                              m + ".lock", f"keel plugins lock {m}")
        self.assertRegex(line, "^keel: error: " + m + r":6:\d+: ")
        self.assertFalse(self.ran(), "a plugin ran although the run needs a lock it lacks")
        self.ok("plugins", "lock", m)  # the first lock can be written
        self.ok("validate", m)
        self.one_error(("validate", self.manifest("bad.toml", extra="locked = 1")),
                       "plugins.locked: expected true or false")

    def test_relocking_refuses_a_changed_file_unless_named(self):
        m = self.manifest()
        self.ok("plugins", "lock", m)
        with open(m + ".lock", "rb") as f:
            locked = f.read()
        self.replace_plugin()
        self.one_error(("plugins", "lock", m), f"{self.plugin} changed since {m}.lock pinned "
                       "plugin constructor-plugin 1.0.0", "its code was not run",
                       f"keel plugins lock {m} --update constructor-plugin")
        self.assertFalse(self.ran(), "keel plugins lock ran the replaced file")
        with open(m + ".lock", "rb") as f:
            self.assertEqual(f.read(), locked, "a refused relock changed the lock")
        self.one_error(("plugins", "lock", m, "--update", "constructor-plugn"),
                       "pins no plugin named 'constructor-plugn'", rc=2)
        out = self.ok("plugins", "lock", m, "--update", "constructor-plugin")
        self.assertIn(sha256(self.plugin)[:16], out)
        with open(m + ".lock") as f:
            self.assertIn(sha256(self.plugin), f.read())
        self.assertTrue(self.ran())  # named after review: it loads (the mark is real)
        self.ok("validate", m)

    def test_relocking_does_not_pin_another_copy_found_first(self):
        m = self.manifest(paths=("early", "plugins"))
        os.mkdir(os.path.join(self.d, "early"))
        self.ok("plugins", "lock", m)
        with open(m + ".lock", "rb") as f:
            locked = f.read()
        early = self.copy_plugin("early", extra=b"\0another")
        self.one_error(("plugins", "lock", m), "plugin constructor-plugin now comes from " + early,
                       f"not from the file {m}.lock pins ({self.plugin}",
                       f"keel plugins lock {m} --update constructor-plugin")
        with open(m + ".lock", "rb") as f:
            self.assertEqual(f.read(), locked)
        # The run keeps loading the locked file; the new one is refused before it runs.
        os.remove(self.mark)
        self.ok("validate", m)
        self.assertEqual(open(self.mark).read(), "constructor_plugin\n")  # one library ran

    def test_plugins_listing_and_show_honour_a_manifests_lock(self):
        m = self.manifest()
        self.ok("plugins", "lock", m)
        out = self.ok("plugins", "show", "marked", "--manifest", m)
        self.assertIn("hook marked  (plugin constructor-plugin 1.0.0, " + self.plugin, out)
        self.replace_plugin()
        out = self.ok("plugins", "--manifest", m)
        self.assertIn(f"lock: {m}.lock", out)
        self.assertIn(f"{self.plugin}: not loaded: its sha256", out)
        self.assertFalse(self.ran(), "keel plugins --manifest ran a file the lock refuses")
        self.one_error(("plugins", "show", "marked", "--manifest", m),
                       "no plugin or component named 'marked'", self.plugin, "differs from")
        self.assertFalse(self.ran(), "keel plugins show --manifest ran a file the lock refuses")
        # Without --manifest nothing is locked: the listing loads the file (the mark is real).
        self.ok("plugins", "show", "marked", env={"KEEL_PLUGIN_PATH": os.path.dirname(self.plugin)})
        self.assertTrue(self.ran())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[4:], verbosity=2)
