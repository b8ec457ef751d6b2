"""Plugin packages end to end: `keel plugins pack` a build directory made of fixture plugins,
`install` it (--prefix, and the XDG default), list it, `remove` it; two versions side by side;
--force; and every refusal: one error line, and the plugin directory exactly as it was.
Packages runs its keel command lines in-process: keel_inproc (tests/cli/keel_inproc.cpp, driven
by tests/cli/inproc.py) calls keel::cli_main, the function the `keel` executable runs, in a runner
of each test's own (a plugin, once loaded, stays loaded in the runner, and its constructor does not
run again: the constructor marks below count from the test's start), and a case that leaves
process-global state changed fails; each runner must exit 0 (under the sanitizers: LeakSanitizer's
report). The install that must not run a plugin the test's pack already loaded runs as a keel
process (test_install_never_runs_plugin_code).
PluginLibraries: a plugin's own libraries under a lock and LD_LIBRARY_PATH, and second copies of
a plugin, through keel processes (a library, once loaded, stays loaded in its process; the
dynamic loader reads LD_LIBRARY_PATH at start-up).
Usage: test_packages.py KEEL_BINARY FIXTURE_DIR KEEL_INPROC"""
import gzip
import hashlib
import io
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import unittest

import inproc

KEEL, FIXTURES = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
INPROC = os.path.abspath(sys.argv[3])
TIMEOUT_S = 120
C_PLUGIN = "c_hook.so"                 # plain C, version 0.1.0, components hook:c_event_log ...
CXX_PLUGIN = "throwing_factory.so"     # C++ (LibTorch fingerprint), version 0.1.0
MARKED_PLUGIN = "constructor_plugin.so"  # plain C, 1.0.0; its constructor appends to a mark file
PLAIN_LIB = "constructor_lib.so"       # not a plugin; its constructor appends to a mark file
WRONG_ABI = "wrong_abi.so"             # declares ABI major 2
DEP_PLUGIN = "dep_plugin.so"           # hook dep_hook; needs libkeel_dep_helper.so, RUNPATH $ORIGIN
HELPER = "libkeel_dep_helper.so"       # its constructor appends "dep_helper 1" to the mark file
HELPER_V2 = "dep_helper_v2.so"         # the same soname; "dep_helper 2"
QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                          "quickstart.toml")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def can_be_nobody():
    return os.getuid() == 0 and shutil.which("setpriv") is not None


def staged_for_nobody(tmp, path):
    """A copy of `path` that the other user can read: in `tmp`/for-nobody (mode 0755; `tmp`
    itself must let them in), never in the build tree, which they cannot reach when a parent of
    the checkout is private (a clone in root's home, or in a mode-0700 directory)."""
    stage = os.path.join(tmp, "for-nobody")
    os.makedirs(stage, exist_ok=True)
    os.chmod(stage, 0o755)
    copy = shutil.copy(path, stage)
    os.chmod(copy, 0o644)
    return copy


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(root):
    """Every path under root (hidden ones too) with its mode and, for files, content hash."""
    if not os.path.exists(root):
        return None
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, sha256(p) if n in files else None)
    return out


class OneErrorLine:
    def assert_one_error_line(self, rc, err, *parts):
        """keel failed (exit 1) with one line: 'keel: error: ...; hint: ...' holding `parts`."""
        self.assertEqual(rc, 1, err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("keel: error: "), err)
        self.assertIn("; hint: ", lines[0])
        for part in parts:
            self.assertIn(part, lines[0])


class Packages(OneErrorLine, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="keel-packages-")
        self.home = os.path.join(self.tmp, "home")
        os.mkdir(self.home)
        self.mark = os.path.join(self.tmp, "constructor-mark")
        self.root = os.path.join(self.tmp, "plugins")
        self.pools = {}  # max_file_bytes -> the test's keel_inproc runner under that limit

    def tearDown(self):
        problems = [p for pool in self.pools.values() for p in pool.close()]
        shutil.rmtree(self.tmp)
        self.assertEqual(problems, [], "keel_inproc did not exit clean")

    def keel(self, *args, env=None, cwd=None, max_file_bytes=None, process=False):
        """Runs keel in the test's keel_inproc runner (process=True: as a keel process of its
        own); with max_file_bytes, under RLIMIT_FSIZE: a write past it fails with EFBIG (keel
        ignores SIGXFSZ), so that a test sees a file grow past the bound without filling the
        disk. In-process, fails when keel hangs or leaves process-global state changed."""
        full = {k: v for k, v in os.environ.items()
                if k not in ("KEEL_LOG_LEVEL", "XDG_DATA_HOME", "KEEL_PLUGIN_PATH",
                             "SOURCE_DATE_EPOCH", "KEEL_ALLOW_WRITABLE_PLUGINS")}
        full.update({"HOME": self.home, "KEEL_TEST_CONSTRUCTOR_MARK": self.mark})

        def limit():
            if max_file_bytes is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
        if process:
            full.update(env or {})
            p = subprocess.run([KEEL, *args], capture_output=True, text=True, env=full,
                               cwd=cwd or self.tmp, timeout=TIMEOUT_S, preexec_fn=limit)
            return p.returncode, p.stdout, p.stderr
        if max_file_bytes not in self.pools:
            self.pools[max_file_bytes] = inproc.Pool(INPROC, TIMEOUT_S, env=full, preexec_fn=limit)
        # argv[0] "keel" (keel on PATH): the commands hints name to run are "keel ...".
        return self.pools[max_file_bytes].keel(["keel", *args], cwd=cwd or self.tmp, env=env)

    def ok(self, *args, **kw):
        rc, out, err = self.keel(*args, **kw)
        self.assertEqual(rc, 0, f"keel {' '.join(args)}: {err}")
        return out

    def build_dir(self, plugins, name="acme-hooks", version="0.1.0", where="build", extra=""):
        """A plugin 'build directory': fixture .so files plus the keel-plugin.toml a plugin's
        meson.build writes (name, version, description, license)."""
        d = os.path.join(self.tmp, where)
        os.mkdir(d)
        for p in plugins:
            shutil.copy(os.path.join(FIXTURES, p), d)
        with open(os.path.join(d, "keel-plugin.toml"), "w") as f:
            f.write(f'name = "{name}"\nversion = "{version}"\ndescription = "test package"\n'
                    f'license = "MIT"\n{extra}')
        return d

    def package_dir(self, plugins=(C_PLUGIN,), where="pkg", **kw):
        """A package directory packed from fixture plugins."""
        build = self.build_dir(list(plugins), where=where + "-build", **kw)
        out = os.path.join(self.tmp, where)
        self.ok("plugins", "pack", build, "--output", out)
        return out

    def edit_toml(self, pkg, pattern, new):
        """Replaces the first match of the regex `pattern` in pkg/keel-plugin.toml."""
        path = os.path.join(pkg, "keel-plugin.toml")
        with open(path) as f:
            text = f.read()
        edited, n = re.subn(pattern, new, text, count=1, flags=re.M)
        self.assertEqual(n, 1, f"{pattern!r} not in {text}")
        with open(path, "w") as f:
            f.write(edited)

    # ---- pack ------------------------------------------------------------------------------

    def test_pack_writes_a_complete_reproducible_tarball(self):
        build = self.build_dir([C_PLUGIN, CXX_PLUGIN, PLAIN_LIB])
        out = self.ok("plugins", "pack", build)
        tarball = os.path.join(self.tmp, "acme-hooks-0.1.0.tar.gz")
        self.assertIn(f"packed acme-hooks 0.1.0 ({C_PLUGIN}, {CXX_PLUGIN}) into {tarball}", out)
        with tarfile.open(tarball) as t:
            members = {m.name: m for m in t.getmembers()}
            self.assertEqual(sorted(members), sorted([
                "acme-hooks-0.1.0", "acme-hooks-0.1.0/keel-plugin.toml",
                "acme-hooks-0.1.0/" + C_PLUGIN, "acme-hooks-0.1.0/" + CXX_PLUGIN]))
            self.assertTrue(members["acme-hooks-0.1.0"].isdir())
            self.assertEqual(members["acme-hooks-0.1.0/" + C_PLUGIN].mode, 0o644)
            meta = tomllib.loads(t.extractfile("acme-hooks-0.1.0/keel-plugin.toml").read().decode())
        self.assertEqual(meta["name"], "acme-hooks")
        self.assertEqual(meta["version"], "0.1.0")
        self.assertEqual(meta["license"], "MIT")
        self.assertRegex(meta["abi"], r"^1\.\d+$")
        self.assertIn("hook:c_event_log", meta["components"])
        self.assertIn("hook:throws_on_create", meta["components"])
        # The C++ plugin's fingerprint; the plain C one has none.
        self.assertRegex(meta["torch_version"], r"^\d+\.\d+")
        self.assertIn(meta["cxx11_abi"], (0, 1))
        # The non-plugin library beside them is skipped.
        self.assertEqual(meta["files"], {C_PLUGIN: sha256(os.path.join(FIXTURES, C_PLUGIN)),
                                         CXX_PLUGIN: sha256(os.path.join(FIXTURES, CXX_PLUGIN))})
        with open(tarball, "rb") as f:
            first = f.read()
        time.sleep(1.1)  # a time in the gzip header would now differ
        self.ok("plugins", "pack", build)
        with open(tarball, "rb") as f:
            self.assertEqual(f.read(), first, "packing twice gave different bytes")
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith(".")], [])

    def test_pack_plain_c_has_no_fingerprint(self):
        pkg = self.package_dir([C_PLUGIN])
        self.assertEqual(sorted(os.listdir(pkg)), [C_PLUGIN, "keel-plugin.toml"])
        with open(os.path.join(pkg, "keel-plugin.toml"), "rb") as f:
            meta = tomllib.load(f)
        self.assertNotIn("torch_version", meta)
        self.assertNotIn("cxx11_abi", meta)

    def test_pack_refusals(self):
        build = self.build_dir([C_PLUGIN], version="0.2.0")
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"{build}/keel-plugin.toml:2:11: says version 0.2.0, "
                                   f"but {C_PLUGIN} declares 0.1.0")
        build = self.build_dir([PLAIN_LIB], where="nothing")
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"{build}: no keel plugin .so in it (skipped: "
                                   f"{PLAIN_LIB} (", "hint: build the plugin first")
        build = self.build_dir([WRONG_ABI], where="wrong-abi")
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"{build}/{WRONG_ABI}: cannot pack it: built for "
                                   "plugin ABI 2.0")
        build = self.build_dir([C_PLUGIN], where="typo", extra='licence = "MIT"\n')
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"{build}/keel-plugin.toml:5:1: unknown key "
                                   '"licence"', "did you mean 'license'?")
        build = self.build_dir([C_PLUGIN], where="badname", name="Acme")
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"{build}/keel-plugin.toml:1:8: 'Acme': a package "
                                   "name starts with a lowercase letter or a digit")
        self.assertEqual([n for n in os.listdir(self.tmp) if n.endswith(".tar.gz")], [])

    # ---- install, list, remove -------------------------------------------------------------

    def test_pack_install_list_remove(self):
        build = self.build_dir([C_PLUGIN, MARKED_PLUGIN], version="0.1.0")
        # The marked plugin says 1.0.0: pack refuses the mix; pack the C plugin alone.
        rc, _, err = self.keel("plugins", "pack", build)
        self.assert_one_error_line(rc, err, f"declares 1.0.0")
        os.remove(os.path.join(build, MARKED_PLUGIN))
        self.ok("plugins", "pack", build)
        tarball = os.path.join(self.tmp, "acme-hooks-0.1.0.tar.gz")
        out = self.ok("plugins", "install", tarball, "--prefix", self.root)
        target = os.path.join(self.root, "acme-hooks", "0.1.0")
        self.assertIn(f"installed acme-hooks 0.1.0 into {target} (components: hook:c_event_log",
                      out)
        self.assertEqual(sorted(os.listdir(target)), [C_PLUGIN, "installed.toml",
                                                      "keel-plugin.toml"])
        self.assertEqual(os.stat(target).st_mode & 0o777, 0o755)
        for f in os.listdir(target):
            self.assertEqual(os.stat(os.path.join(target, f)).st_mode & 0o777, 0o644, f)
        self.assertEqual(sha256(os.path.join(target, C_PLUGIN)),
                         sha256(os.path.join(FIXTURES, C_PLUGIN)))
        with open(os.path.join(target, "installed.toml"), "rb") as f:
            installed = tomllib.load(f)
        self.assertEqual(installed["source"], tarball)
        self.assertRegex(installed["installed"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
        self.assertEqual([n for n in os.listdir(self.root) if n.startswith(".")], [])

        listing = self.ok("plugins", "--prefix", self.root)
        self.assertRegex(listing, rf"acme-hooks +0\.1\.0 .*from {re.escape(tarball)}, "
                                  rf"{installed['installed']}")

        out = self.ok("plugins", "remove", "acme-hooks", "--prefix", self.root)
        self.assertIn(f"removed acme-hooks 0.1.0 from {self.root}", out)
        self.assertEqual(os.listdir(self.root), [])
        rc, _, err = self.keel("plugins", "remove", "acme-hooks", "--prefix", self.root)
        self.assert_one_error_line(rc, err, "acme-hooks: no package of that name is installed")

    def test_install_into_the_xdg_data_dir_and_the_loader_finds_it(self):
        pkg = self.package_dir([C_PLUGIN])
        xdg = os.path.join(self.tmp, "xdg")
        self.ok("plugins", "install", pkg, env={"XDG_DATA_HOME": xdg})
        target = os.path.join(xdg, "keel", "plugins", "acme-hooks", "0.1.0")
        self.assertTrue(os.path.isfile(os.path.join(target, C_PLUGIN)))
        # Without XDG_DATA_HOME: ~/.local/share.
        self.ok("plugins", "install", pkg)
        self.assertTrue(os.path.isfile(os.path.join(
            self.home, ".local", "share", "keel", "plugins", "acme-hooks", "0.1.0", C_PLUGIN)))
        # Discovery searches the installed package and loads its plugin from there.
        out = self.ok("plugins", env={"XDG_DATA_HOME": xdg})
        plugin = re.escape(os.path.join(target, C_PLUGIN))
        self.assertRegex(out, rf"\nhook +c_event_log .* {plugin}\n")
        self.assertRegex(out, r"\n +acme-hooks +0\.1\.0 +\(searched\) +from ")

    def test_install_never_runs_plugin_code(self):
        build = self.build_dir([MARKED_PLUGIN], name="marked", version="1.0.0")
        pkg = os.path.join(self.tmp, "marked-pkg")
        self.ok("plugins", "pack", build, "--output", pkg)
        self.assertTrue(os.path.exists(self.mark), "pack loads the plugin, so the mark is real")
        os.remove(self.mark)
        # A process of its own: in the runner, the plugin pack loaded would not run again.
        self.ok("plugins", "install", pkg, "--prefix", self.root, process=True)
        self.assertFalse(os.path.exists(self.mark), "install ran the plugin's constructor")

    def test_two_versions_side_by_side(self):
        pkg1 = self.package_dir([C_PLUGIN])
        pkg2 = os.path.join(self.tmp, "pkg2")
        shutil.copytree(pkg1, pkg2)
        self.edit_toml(pkg2, r'^version = "0\.1\.0"', 'version = "0.2.0"')
        self.ok("plugins", "install", pkg1, "--prefix", self.root)
        self.ok("plugins", "install", pkg2, "--prefix", self.root)
        self.assertEqual(sorted(os.listdir(os.path.join(self.root, "acme-hooks"))),
                         ["0.1.0", "0.2.0"])
        listing = self.ok("plugins", "--prefix", self.root)
        self.assertRegex(listing, r"acme-hooks +0\.1\.0 [^\n]*\n +acme-hooks +0\.2\.0 ")
        before = snapshot(self.root)
        rc, _, err = self.keel("plugins", "remove", "acme-hooks", "--prefix", self.root)
        self.assert_one_error_line(rc, err, "acme-hooks: 2 versions are installed in "
                                   f"{self.root} (0.1.0, 0.2.0); hint: name one, e.g. "
                                   "`keel plugins remove acme-hooks@0.2.0`")
        rc, _, err = self.keel("plugins", "remove", "acme-hooks@0.3.0", "--prefix", self.root)
        self.assert_one_error_line(rc, err, "acme-hooks@0.3.0: that version is not installed",
                                   "(installed: 0.1.0, 0.2.0)")
        rc, _, err = self.keel("plugins", "remove", "acme-hook", "--prefix", self.root)
        self.assert_one_error_line(rc, err, "(installed: acme-hooks)", "did you mean 'acme-hooks'?")
        self.assertEqual(snapshot(self.root), before)
        self.ok("plugins", "remove", "acme-hooks@0.1.0", "--prefix", self.root)
        self.assertEqual(os.listdir(os.path.join(self.root, "acme-hooks")), ["0.2.0"])
        self.ok("plugins", "remove", "acme-hooks", "--prefix", self.root)
        self.assertEqual(os.listdir(self.root), [])

    def test_force_replaces_an_installed_version(self):
        pkg = self.package_dir([C_PLUGIN])
        self.ok("plugins", "install", pkg, "--prefix", self.root)
        before = snapshot(self.root)
        again = os.path.join(self.tmp, "again")
        shutil.copytree(pkg, again)
        self.edit_toml(again, 'description = "test package"', 'description = "second build"')
        rc, _, err = self.keel("plugins", "install", again, "--prefix", self.root)
        target = os.path.join(self.root, "acme-hooks", "0.1.0")
        self.assert_one_error_line(rc, err, f"acme-hooks 0.1.0 is already installed in {target}",
                                   "hint: add --force to replace it")
        self.assertEqual(snapshot(self.root), before)
        out = self.ok("plugins", "install", again, "--prefix", self.root, "--force")
        self.assertIn(f"replaced acme-hooks 0.1.0 into {target}", out)
        with open(os.path.join(target, "installed.toml"), "rb") as f:
            self.assertEqual(tomllib.load(f)["source"], again)
        with open(os.path.join(target, "keel-plugin.toml"), "rb") as f:
            self.assertEqual(tomllib.load(f)["description"], "second build")
        self.assertEqual(sorted(os.listdir(self.root)), ["acme-hooks"])  # no scratch left

    # ---- refusals: one line, and the plugin directory untouched ----------------------------

    def assert_refused(self, package, *parts, root=None, max_file_bytes=None):
        root = root or self.root
        before = snapshot(root)
        rc, _, err = self.keel("plugins", "install", package, "--prefix", root,
                               max_file_bytes=max_file_bytes)
        self.assert_one_error_line(rc, err, *parts)
        self.assertEqual(snapshot(root), before, "a refused install changed " + root)
        self.assertFalse(os.path.exists(self.mark), "a refused install ran plugin code")

    def installed_one(self):
        """Installs a good package first, so that each refusal must leave it alone."""
        self.ok("plugins", "install", self.package_dir([C_PLUGIN], where="good"),
                "--prefix", self.root)

    def test_refused_directory_packages(self):
        self.installed_one()
        pkg = self.package_dir([C_PLUGIN, CXX_PLUGIN])
        toml = os.path.join(pkg, "keel-plugin.toml")

        def variant(name, change):
            d = os.path.join(self.tmp, name)
            shutil.copytree(pkg, d)
            change(d)
            return d

        def append(d, file, data):
            with open(os.path.join(d, file), "ab") as f:
                f.write(data)

        d = variant("tampered", lambda d: append(d, C_PLUGIN, b"\0"))
        self.assert_refused(d, f"{d}/{C_PLUGIN}: sha256 ", "differs from",
                            f"listed at {d}/keel-plugin.toml:")
        d = variant("extra", lambda d: shutil.copy(os.path.join(FIXTURES, C_PLUGIN),
                                                   os.path.join(d, "extra.so")))
        self.assert_refused(d, f"{d}/extra.so: not listed in [files] of keel-plugin.toml")
        d = variant("missing", lambda d: os.remove(os.path.join(d, CXX_PLUGIN)))
        self.assert_refused(d, f"[files] lists \"{CXX_PLUGIN}\", which the package does not hold")
        d = variant("no-license", lambda d: self.edit_toml(d, 'license = "MIT"\n', ""))
        self.assert_refused(d, f"{d}/keel-plugin.toml: no 'license'; hint: add license = ")
        d = variant("abi-major", lambda d: self.edit_toml(d, r'^abi = "1\.', 'abi = "2.'))
        self.assert_refused(d, f"{d}/keel-plugin.toml:5:7: acme-hooks 0.1.0 needs plugin ABI 2.",
                            ", this keel speaks 1.")
        d = variant("abi-minor", lambda d: self.edit_toml(d, r'^abi = .*$', 'abi = "1.99"'))
        self.assert_refused(d, "acme-hooks 0.1.0 needs plugin ABI 1.99",
                            ", newer than this keel's 1.")
        d = variant("torch", lambda d: self.edit_toml(d, r'^torch_version = "',
                                                      'torch_version = "0.0.1-'))
        self.assert_refused(d, f"{d}/keel-plugin.toml:6:17: acme-hooks 0.1.0 was built with "
                            "LibTorch 0.0.1-", "this keel uses LibTorch ")
        d = variant("link", lambda d: os.symlink(C_PLUGIN, os.path.join(d, "link.so")))
        self.assert_refused(d, f"{d}/link.so: a symbolic link")
        d = variant("subdir", lambda d: os.mkdir(os.path.join(d, "sub")))
        self.assert_refused(d, f"{d}/sub: a subdirectory")

        # A non-plugin library, listed with its right hash: still refused, never loaded.
        def plain_lib(d):
            shutil.copy(os.path.join(FIXTURES, PLAIN_LIB), d)
            self.edit_toml(d, r"^\[files\]\n", f'[files]\n"{PLAIN_LIB}" = '
                           f'"{sha256(os.path.join(FIXTURES, PLAIN_LIB))}"\n')
        d = variant("plain-lib", plain_lib)
        self.assert_refused(d, f"{d}/{PLAIN_LIB}: not a keel plugin: ", "keel_plugin_entry")
        self.assertTrue(os.path.exists(toml))

    def test_install_refuses_runpaths_another_user_could_fill(self):
        # The case: a RUNPATH naming a directory that does not exist yet, under the
        # sticky /tmp, which another user could create later; and a relative one.
        pkg = self.package_dir([C_PLUGIN])
        self.assertFalse(os.path.exists("/tmp/keel-fixture-missing-runpath"))
        for plugin, why in (("dep_missing.so", "RUNPATH directory /tmp/keel-fixture-missing-"
                             "runpath does not exist (another user could create it later)"),
                            ("dep_relative.so", "RUNPATH entry 'lib' is relative")):
            d = os.path.join(self.tmp, plugin)
            shutil.copytree(pkg, d)
            shutil.copy(os.path.join(FIXTURES, plugin), d)
            self.edit_toml(d, r"^\[files\]\n", f'[files]\n"{plugin}" = '
                           f'"{sha256(os.path.join(FIXTURES, plugin))}"\n')
            self.assert_refused(d, f"{d}/{plugin}: not installed: {why}")

    def tarball(self, name, entries):
        """A .tar.gz from (TarInfo fields, data) pairs."""
        path = os.path.join(self.tmp, name)
        with tarfile.open(path, "w:gz") as t:
            for info, data in entries:
                t.addfile(info, io.BytesIO(data) if data is not None else None)
        return path

    def test_refused_tarballs(self):
        self.installed_one()
        pkg = self.package_dir([C_PLUGIN])
        top = "acme-hooks-0.1.0"

        def member(name, type=tarfile.REGTYPE, data=b"", linkname=""):
            info = tarfile.TarInfo(name)
            info.type = type
            info.mode = 0o755 if type == tarfile.DIRTYPE else 0o644
            info.linkname = linkname
            info.size = len(data) if type == tarfile.REGTYPE else 0
            return info, (data if type == tarfile.REGTYPE else None)

        def good():
            out = [member(top + "/", tarfile.DIRTYPE)]
            for f in sorted(os.listdir(pkg)):
                with open(os.path.join(pkg, f), "rb") as fh:
                    out.append(member(f"{top}/{f}", data=fh.read()))
            return out

        # The hand-made good tarball installs: the refusals below differ only in the fault.
        ok = self.tarball("good.tar.gz", good())
        fresh = os.path.join(self.tmp, "fresh-root")
        self.ok("plugins", "install", ok, "--prefix", fresh)

        t = self.tarball("dotdot.tar.gz", good() + [member("../evil", data=b"x")])
        self.assert_refused(t, f"{t}: entry \"../evil\": a path with '..'")
        t = self.tarball("dotdot2.tar.gz", good() + [member(f"{top}/../../evil", data=b"x")])
        self.assert_refused(t, "a path with '..'")
        t = self.tarball("absolute.tar.gz", good() + [member("/tmp/evil.so", data=b"x")])
        self.assert_refused(t, f"{t}: entry \"/tmp/evil.so\": an absolute path")
        t = self.tarball("symlink.tar.gz",
                         good() + [member(f"{top}/link.so", tarfile.SYMTYPE, linkname=C_PLUGIN)])
        self.assert_refused(t, f"{t}: entry \"{top}/link.so\": a symbolic link")
        t = self.tarball("hardlink.tar.gz",
                         good() + [member(f"{top}/hard.so", tarfile.LNKTYPE,
                                          linkname=f"{top}/{C_PLUGIN}")])
        self.assert_refused(t, "a hard link")
        t = self.tarball("device.tar.gz", good() + [member(f"{top}/dev", tarfile.CHRTYPE)])
        self.assert_refused(t, "not a regular file or directory")
        t = self.tarball("two-tops.tar.gz", good() + [member("other/", tarfile.DIRTYPE)])
        self.assert_refused(t, "a second top-level entry beside \"acme-hooks-0.1.0/\"")
        t = self.tarball("nested.tar.gz", good() + [member(f"{top}/sub/x.so", data=b"x")])
        self.assert_refused(t, "a subdirectory")
        t = self.tarball("renamed.tar.gz",
                         [member("acme-hooks-9.9.9" + info.name[len(top):], info.type, data or b"")
                          for info, data in good()])
        self.assert_refused(t, "its top-level directory is \"acme-hooks-9.9.9/\", not "
                            "\"acme-hooks-0.1.0/\"")
        t = os.path.join(self.tmp, "not-gzip.tar.gz")
        with open(t, "w") as f:
            f.write("not an archive\n")
        self.assert_refused(t, f"{t}: cannot read it as a .tar.gz")
        tampered = []
        for info, data in good():
            if info.name == f"{top}/{C_PLUGIN}":
                data = data[:-1] + bytes([data[-1] ^ 1])
            tampered.append(member(info.name, info.type, data or b""))
        t = self.tarball("tampered.tar.gz", tampered)
        self.assert_refused(t, f"{t}:{top}/{C_PLUGIN}: sha256 ", "differs from")

        # Into a plugin directory that does not exist yet: a refusal leaves none behind.
        missing = os.path.join(self.tmp, "new", "plugins")
        t = self.tarball("dotdot3.tar.gz", good() + [member("../evil", data=b"x")])
        self.assert_refused(t, "a path with '..'", root=missing)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "new")))
        tampered_root = os.path.join(self.tmp, "new2")
        t = self.tarball("tampered2.tar.gz", tampered)
        self.assert_refused(t, "differs from", root=tampered_root)
        self.assertFalse(os.path.exists(tampered_root))

    def test_tar_bombs(self):
        """A package .tar.gz that would write much more than it holds is refused from its
        headers, before any data is written: keel runs with RLIMIT_FSIZE at 1 MiB, so a write
        past that fails (EFBIG: keel ignores SIGXFSZ) and the error line is "File too large"
        instead of the refusal. The plugin directory does not exist
        before, and must not after."""
        pkg = self.package_dir([C_PLUGIN])
        top = "acme-hooks-0.1.0"
        limit = 1 << 20

        def good_tar():
            """The package's entries as tar bytes, without the end-of-archive blocks."""
            out = io.BytesIO()
            t = tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT)
            info = tarfile.TarInfo(top + "/")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
            for f in sorted(os.listdir(pkg)):
                with open(os.path.join(pkg, f), "rb") as fh:
                    data = fh.read()
                info = tarfile.TarInfo(f"{top}/{f}")
                info.size, info.mode = len(data), 0o644
                t.addfile(info, io.BytesIO(data))
            return out.getvalue()  # not closed: no end blocks yet

        def header(name, size, type=tarfile.REGTYPE):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.type = size, 0o644, type
            return bytearray(info.tobuf(format=tarfile.GNU_FORMAT))

        def checksum(h):
            h[148:156] = b" " * 8
            h[148:156] = b"%06o\0 " % sum(h)
            return bytes(h)

        def write_gz(name, raw):
            path = os.path.join(self.tmp, name)
            with open(path, "wb") as f:
                f.write(gzip.compress(raw))
            return path

        end = b"\0" * 1024
        # An old-GNU sparse entry ('S'): 512 bytes of data at the end of a 2 GiB file of holes.
        real = 2 << 30
        h = header(f"{top}/sparse.so", 512, tarfile.GNUTYPE_SPARSE)
        h[386:398] = b"%011o\0" % (real - 512)  # sparse[0].offset
        h[398:410] = b"%011o\0" % 512           # sparse[0].numbytes
        h[483:495] = b"%011o\0" % real          # realsize
        sparse = write_gz("sparse.tar.gz", checksum(h) + b"x" * 512 + end)
        self.assertLess(os.path.getsize(sparse), 400)
        self.assert_refused(sparse, f"{sparse}: entry \"{top}/sparse.so\": a sparse file",
                            max_file_bytes=limit)
        # The same after the package's good files.
        t = write_gz("sparse2.tar.gz", good_tar() + checksum(h) + b"x" * 512 + end)
        self.assert_refused(t, "a sparse file", max_file_bytes=limit)
        # A pax (GNU.sparse 0.1) sparse entry of the same shape, after the good files.
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as pax:
            info = tarfile.TarInfo(f"{top}/sparse.so")
            info.size = 512
            info.pax_headers = {"GNU.sparse.major": "0", "GNU.sparse.minor": "1",
                                "GNU.sparse.size": str(real), "GNU.sparse.numblocks": "1",
                                "GNU.sparse.map": f"{real - 512},512"}
            pax.addfile(info, io.BytesIO(b"x" * 512))
        t = write_gz("pax-sparse.tar.gz", good_tar() + out.getvalue())
        self.assert_refused(t, f"{t}: entry \"{top}/sparse.so\": a sparse file",
                            max_file_bytes=limit)

        # A file that [files] does not list: refused before anything is extracted.
        t = write_gz("unlisted.tar.gz", good_tar() + checksum(header(f"{top}/extra.so", 4 << 20))
                     + b"\0" * (4 << 20) + end)
        self.assert_refused(t, f"{t}:{top}/extra.so: not listed in [files] of keel-plugin.toml; "
                            "nothing of the package was extracted", max_file_bytes=limit)

        # A file whose header claims more than a package file may hold (1 GiB), followed by
        # 2 MiB of its data and the end of the stream.
        t = write_gz("too-big.tar.gz", good_tar() +
                     checksum(header(f"{top}/{C_PLUGIN}.big", (1 << 30) + 1)) + b"\0" * (2 << 20))
        self.assert_refused(t, f"entry \"{top}/{C_PLUGIN}.big\": 1073741825 bytes, more than a "
                            "package file may hold (1024 MiB)", max_file_bytes=limit)

        # More entries than a package may have (256), each empty.
        many = b"".join(checksum(header(f"{top}/x{i}.so", 0)) for i in range(300))
        t = write_gz("many.tar.gz", good_tar() + many + end)
        self.assert_refused(t, f"{t}: more than 256 entries", max_file_bytes=limit)

    def test_bad_arguments(self):
        rc, _, err = self.keel("plugins", "install")
        self.assertEqual(rc, 2, err)
        self.assertIn("keel plugins install: needs exactly one PACKAGE, got 0 arguments", err)
        rc, _, err = self.keel("plugins", "remove", "x@", "--prefix", self.root)
        self.assertEqual(rc, 2, err)
        self.assertIn("'x@': not NAME or NAME@VERSION", err)
        rc, _, err = self.keel("plugins", "pack", self.tmp, "--force")
        self.assertEqual(rc, 2, err)
        self.assertIn("--force: `keel plugins pack` does not take it", err)
        rc, _, err = self.keel("plugins", "install", os.path.join(self.tmp, "nope.tar.gz"),
                               "--prefix", self.root)
        self.assert_one_error_line(rc, err, "nope.tar.gz: no such file or directory")
        self.assertFalse(os.path.exists(self.root))


class PluginLibraries(OneErrorLine, unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="keel-libraries-")
        os.chmod(self.tmp, 0o755)  # the other user may enter (the directories below say more)
        self.mark = os.path.join(self.tmp, "constructor-mark")
        self.plugins = os.path.join(self.tmp, "p")
        os.mkdir(self.plugins)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def keel(self, *args, env=None, cwd=None):
        full = {k: v for k, v in os.environ.items()
                if k not in ("KEEL_LOG_LEVEL", "KEEL_PLUGIN_PATH", "LD_LIBRARY_PATH",
                             "KEEL_ALLOW_WRITABLE_PLUGINS")}
        full.update({"HOME": self.tmp, "XDG_DATA_HOME": os.path.join(self.tmp, "data"),
                     "KEEL_TEST_CONSTRUCTOR_MARK": self.mark})
        full.update(env or {})
        p = subprocess.run([KEEL, *args], capture_output=True, text=True, env=full,
                           cwd=cwd or self.tmp, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def marks(self):
        if not os.path.exists(self.mark):
            return []
        with open(self.mark) as f:
            return f.read().splitlines()

    def manifest(self, paths, hook=None):
        m = os.path.join(self.tmp, "m.toml")
        with open(m, "w") as f:
            f.write(f'extends = "{QUICKSTART}"\n[run]\noutput_dir = "{self.tmp}/run"\n'
                    f'[plugins]\npaths = {paths!r}\n'.replace("'", '"'))
            if hook:
                f.write(f'[[hooks]]\ntype = "{hook}"\n')
        return m

    def test_a_locked_plugins_own_library_is_locked_too(self):
        if not can_be_nobody():
            self.skipTest("needs root and setpriv to act as another user")
        for f in (DEP_PLUGIN, HELPER):
            shutil.copy(os.path.join(FIXTURES, f), self.plugins)
        helper = os.path.join(self.plugins, HELPER)
        m = self.manifest(["p"], "dep_hook")
        # As in the reproduction, LD_LIBRARY_PATH names the helper's directory: keel
        # 0ae91d6 loads a plugin as /proc/self/fd/N, from where $ORIGIN does not reach it.
        env = {"LD_LIBRARY_PATH": self.plugins}
        rc, out, err = self.keel("plugins", "lock", m, env=env)
        self.assertEqual(rc, 0, err)
        with open(m + ".lock", "rb") as f:
            lock = tomllib.load(f)
        entry = [e for e in lock["plugin"] if e["name"] == "test-dep-plugin"]
        self.assertEqual(len(entry), 1, lock)
        self.assertEqual(entry[0].get("dependencies"),
                         [{"name": HELPER, "path": helper, "sha256": sha256(helper)}])
        os.remove(self.mark)
        # The other user replaces the helper in a directory they can write.
        os.chmod(self.plugins, 0o777)
        v2 = staged_for_nobody(self.tmp, os.path.join(FIXTURES, HELPER_V2))
        subprocess.run(NOBODY + ["sh", "-c", f"rm -f {helper} && cp {v2} {helper}"], check=True)
        rc, _, err = self.keel("validate", m,
                               env={**env, "KEEL_ALLOW_WRITABLE_PLUGINS": "1"})
        self.assert_one_error_line(rc, err, "plugin test-dep-plugin 1.0.0", "is locked but was "
                                   "not loaded", f"its library {HELPER} ({helper}, sha256 "
                                   f"{sha256(helper)[:16]}...) differs from "
                                   f"{entry[0]['dependencies'][0]['sha256'][:16]}...")
        self.assertNotIn("dep_helper 2", self.marks())  # its constructor never ran
        rc, _, err = self.keel("validate", m, env=env)  # without KEEL_ALLOW_WRITABLE_PLUGINS
        self.assert_one_error_line(rc, err, f"its directory {self.plugins} is writable by every "
                                   "user (mode 0777)")
        self.assertNotIn("dep_helper 2", self.marks())

    def test_an_empty_ld_library_path_entry_is_refused(self):
        # The dynamic loader reads an empty entry as the working directory, where the other
        # user planted a library of the helper's name.
        if not can_be_nobody():
            self.skipTest("needs root and setpriv to act as another user")
        for f in (DEP_PLUGIN, HELPER):
            shutil.copy(os.path.join(FIXTURES, f), self.plugins)
        cwd = os.path.join(self.tmp, "shared")
        os.mkdir(cwd)
        os.chmod(cwd, 0o1777)
        subprocess.run(NOBODY + ["cp", staged_for_nobody(self.tmp, os.path.join(FIXTURES, HELPER_V2)),
                                 os.path.join(cwd, HELPER)], check=True)
        rc, out, err = self.keel("plugins", cwd=cwd,
                                 env={"KEEL_PLUGIN_PATH": self.plugins,
                                      "LD_LIBRARY_PATH": ":/usr/lib"})
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{self.plugins}/{DEP_PLUGIN}: not loaded: needs {HELPER}, which the "
                      "dynamic loader would look for in the working directory: LD_LIBRARY_PATH "
                      "has an empty entry; hint: ", out)
        self.assertNotIn("dep_helper 2", self.marks())
        # Without the empty entry, the helper beside the plugin loads (from its checked copy).
        rc, out, err = self.keel("plugins", cwd=cwd, env={"KEEL_PLUGIN_PATH": self.plugins})
        self.assertEqual(rc, 0, err)
        self.assertIn("dep_hook", out)
        self.assertEqual(self.marks(), ["dep_helper 1"])

    def test_a_second_copy_of_a_plugin_is_named_and_refused_when_used(self):
        for d, f in (("a", MARKED_PLUGIN), ("b", "constructor_plugin_v2.so")):
            os.mkdir(os.path.join(self.tmp, d))
            shutil.copy(os.path.join(FIXTURES, f), os.path.join(self.tmp, d))
        first = os.path.join(self.tmp, "a", MARKED_PLUGIN)
        second = os.path.join(self.tmp, "b", "constructor_plugin_v2.so")
        # Not used by the run: a warning on the console naming both files and versions.
        rc, out, err = self.keel("validate", self.manifest(["a", "b"]))
        self.assertEqual(rc, 0, err)
        self.assertIn(f"plugin constructor-plugin 2.0.0 at {second} is not used: "
                      f"constructor-plugin 1.0.0 at {first} comes first on the search path", out)
        # Used by the run, with another version beside it: an error.
        m = self.manifest(["a", "b"], "marked")
        rc, _, err = self.keel("validate", m)
        self.assert_one_error_line(rc, err, f"{m}:", "[hooks[0]].type: hook 'marked' comes from "
                                   f"plugin constructor-plugin 1.0.0 ({first}), and another "
                                   f"version of that plugin, 2.0.0 ({second}), is on the search "
                                   "path too")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
