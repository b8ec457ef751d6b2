"""`keel prepare` and the `tokens` dataset (plugins/tokens), checked against numpy.

- prepare: tokens.bin decoded through vocab.json with numpy gives back the text (char level,
  byte level, non-ASCII text, bytes that are not UTF-8); the dtype is uint16 up to 65536 ids and
  uint32 above; invalid UTF-8 is one error line naming the byte offset, and writes nothing.
- the dataset (driven by tokens_dump through keel/testing.hpp): sequential batches equal the
  numpy windows of the memory-mapped file, targets are the inputs shifted by one token, the
  train and val splits do not overlap, random sampling is deterministic per seed and epoch and
  follows the generator its header documents, seek matches replay, world_size 2 shares an epoch
  as documented, token counts are exact, and bad files give one clear error.
- `keel validate` accepts a manifest whose data is a tokens dataset.

Every tokens_dump case runs in one `tokens_dump --batch` process (tests/plugins/probe.hpp); a failing
case's message comes back from it. Files live in a temporary directory (tempfile).

Usage: test_tokens.py KEEL TOKENS_DUMP PLUGIN.so [unittest args]"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from probe_batch import Batch

KEEL, DUMP, PLUGIN = (os.path.abspath(a) for a in sys.argv[1:4])
M64 = (1 << 64) - 1
# Non-ASCII text: 2-, 3- and 4-byte UTF-8, control characters, a NUL.
MIXED = "héllo wörld, 中文字符 and 𝄞 music\tnote\r\n\0end ✓\n"


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def random_offset(seed, epoch, i, positions):
    """The offset of sample i of `epoch` as plugins/tokens/tokens.cpp documents it."""
    key = mix((seed + mix((epoch + 1) & M64)) & M64)
    d = mix((key + (i + 1) * 0x9E3779B97F4A7C15) & M64)
    return (d * positions) >> 64


class Tokens(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Every tokens_dump case of the class in one process (a LibTorch start-up each saved).
        cls.dumps = Batch(DUMP)
        cls.tmp = tempfile.mkdtemp(prefix="keel-tokens-")
        rng = np.random.default_rng(7)
        alphabet = list("abcdefgh ,.\nαβγ中文")
        cls.text = "".join(rng.choice(alphabet, size=6000))
        cls.dir = cls.prepare_text(cls.text, "corpus")

    @classmethod
    def tearDownClass(cls):
        cases, status = cls.dumps.cases, cls.dumps.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        print(f"{cases} cases in one tokens_dump process", file=sys.stderr)
        if status != 0:
            raise AssertionError(f"tokens_dump --batch exited with status {status}")

    # ---- helpers --------------------------------------------------------------------------
    @classmethod
    def prepare_text(cls, text, name, level=None, documents=None):
        data = text.encode("utf-8") if isinstance(text, str) else text
        src = os.path.join(cls.tmp, name + ".txt")
        with open(src, "wb") as f:
            f.write(data)
        out = os.path.join(cls.tmp, name)
        argv = [KEEL, "prepare", src, "--output", out] + (["--level", level] if level else []) + (
            ["--documents", documents] if documents else [])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        cls.last_stdout = p.stdout
        return out

    def load(self, d):
        with open(os.path.join(d, "vocab.json"), encoding="utf-8") as f:
            meta = json.load(f)
        tokens = np.memmap(os.path.join(d, "tokens.bin"), mode="r",
                           dtype="<u2" if meta["dtype"] == "uint16" else "<u4")
        return meta, tokens

    def decode(self, d):
        meta, tokens = self.load(d)
        self.assertEqual(meta["format"], "keel-tokens")
        self.assertEqual(meta["version"], 1)
        self.assertEqual(meta["size"], len(meta["vocab"]))
        self.assertEqual(meta["tokens"], len(tokens))
        self.assertLess(int(tokens.max()), meta["size"])
        if meta["level"] == "byte":  # ids 0..255: bytes; a separator id: its text, in UTF-8
            return meta, b"".join(bytes([ord(meta["vocab"][int(t)])]) if t < 256
                                  else meta["vocab"][int(t)].encode("utf-8") for t in tokens)
        return meta, "".join(meta["vocab"][int(t)] for t in tokens)

    def dump(self, *args, path=None, expect_ok=True, **options):
        """Batches of the dataset: (info, array [batches, 2, batch, context])."""
        out = os.path.join(self.tmp, "dump.bin")
        opts = {"path": path or os.path.join(self.dir, "tokens.bin"), **options}
        argv = [PLUGIN, out, *map(str, args)] + [f"{k}={v}" for k, v in opts.items()]
        text, err = self.dumps.run(*argv)
        if not expect_ok:
            self.assertIsNone(text, "the case did not fail")
            lines = err.strip().splitlines()
            self.assertEqual(len(lines), 1, err)
            self.assertIn("; hint: ", lines[0])
            return lines[0]
        self.assertIsNone(err)
        info = json.loads(text)
        arr = np.fromfile(out, dtype=np.int64)
        shapes = info["batches"]
        if not shapes:
            return info, arr.reshape(0, 2, 0, 0)
        b, c = shapes[0][2], shapes[0][3]
        return info, arr.reshape(len(shapes), 2, b, c)

    def split(self, tokens, name, val_fraction=0.1):
        n = len(tokens)
        n_val = int(n * val_fraction)
        return (n - n_val, n) if name == "val" else (0, n - n_val)

    # ---- prepare --------------------------------------------------------------------------
    def test_char_level_round_trip(self):
        d = self.prepare_text(MIXED, "mixed")
        meta, text = self.decode(d)
        self.assertEqual(text, MIXED)
        self.assertEqual(meta["level"], "char")
        self.assertEqual(meta["dtype"], "uint16")
        self.assertEqual(meta["vocab"], sorted(set(MIXED)))  # distinct code points, in order
        self.assertEqual(meta["tokens"], len(MIXED))
        self.assertEqual(os.path.getsize(os.path.join(d, "tokens.bin")), 2 * len(MIXED))
        line = self.last_stdout.strip()
        self.assertEqual(len(line.splitlines()), 1)
        for part in (f"{len(MIXED)} tokens", f"vocabulary of {len(set(MIXED))}", "uint16",
                     os.path.join(d, "tokens.bin")):
            self.assertIn(part, line)
        self.assertEqual(sorted(os.listdir(d)), ["tokens.bin", "vocab.json"])  # no temp file

    def test_documents(self):
        # --documents: each document followed by the separator's own id, the last vocabulary
        # entry, whose string is the separator; empty documents left out; at both levels.
        docs = ["one α", "two", "three\n"]
        text = docs[0] + "\n%\n" + docs[1] + "\n%\n\n%\n" + docs[2]
        for level in ("char", "byte"):
            with self.subTest(level=level):
                d = self.prepare_text(text, "docs-" + level, level=level, documents="\\n%\\n")
                meta, decoded = self.decode(d)
                want = "".join(x + "\n%\n" for x in docs)
                self.assertEqual(decoded, want if level == "char" else want.encode("utf-8"))
                self.assertEqual((meta["documents"], meta["separator"]), (3, meta["size"] - 1))
                self.assertEqual(meta["vocab"][-1], "\n%\n")
                if level == "char":
                    self.assertEqual(meta["vocab"][:-1], sorted(set("".join(docs))))
                    self.assertIn("in 3 documents (separator id", self.last_stdout)
                _, tokens = self.load(d)
                self.assertEqual(int((tokens == meta["separator"]).sum()), 3)
        # The tokens dataset packs them with that separator when its own is not set; data
        # without one is refused with a hint naming --documents.
        for data, error in ((d, None), (self.dir, "names none")):
            m = os.path.join(self.tmp, "packed.toml")
            with open(m, "w") as f:
                f.write(f"""[run]
name = "packed"
output_dir = "{self.tmp}/runs"
[train]
epochs = 1
[model]
type = "gpt"
vocab_size = 300
context = 8
layers = 1
heads = 1
width = 8
[data.train]
type = "tokens"
path = "{data}/tokens.bin"
context = 8
batch_size = 1
val_fraction = 0
sampling = "sequential"
pack_documents = true
[optimizer]
type = "sgd"
lr = 0.1
[loss]
type = "token_cross_entropy"
""")
            p = subprocess.run([KEEL, "validate", m], capture_output=True, text=True, timeout=120)
            if error is None:
                self.assertEqual(p.returncode, 0, p.stderr)
            else:
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn(error, p.stderr)
                self.assertIn("keel prepare TEXT --documents SEP", p.stderr)

    def test_byte_level_round_trip(self):
        data = MIXED.encode("utf-8") + b"\xff\xfe\x80 not utf-8 \xc3"
        d = self.prepare_text(data, "bytes", level="byte")
        meta, back = self.decode(d)
        self.assertEqual(back, data)
        self.assertEqual((meta["level"], meta["dtype"], meta["size"]), ("byte", "uint16", 256))
        self.assertEqual([ord(s) for s in meta["vocab"]], list(range(256)))
        _, tokens = self.load(d)
        np.testing.assert_array_equal(tokens, np.frombuffer(data, dtype=np.uint8))

    def test_dtype_boundary(self):
        # Distinct code points from U+0020 (no surrogates) plus "\n": 65536 of them fit
        # uint16 ids, 65537 need uint32.
        cps = [c for c in range(0x20, 0x20 + 65537 + 2048) if not 0xD800 <= c <= 0xDFFF]
        for count, dtype in ((65536, "uint16"), (65537, "uint32")):
            text = "".join(map(chr, cps[:count - 1])) + "\n" + "".join(map(chr, cps[:count:7]))
            d = self.prepare_text(text, f"wide{count}")
            meta, back = self.decode(d)
            self.assertEqual((meta["size"], meta["dtype"]), (count, dtype))
            self.assertEqual(back, text)
            itemsize = 2 if dtype == "uint16" else 4
            self.assertEqual(os.path.getsize(os.path.join(d, "tokens.bin")), itemsize * len(text))

    def test_invalid_utf8(self):
        cases = [(b"ab\xffc", 2, "0xFF"), (b"abc\xc3", 4, "ends inside a character"),
                 (b"\xc0\x80", 0, "0xC0"),        # overlong NUL
                 (b"x\xed\xa0\x80", 2, "0xA0"),   # a surrogate
                 (b"\xf4\x90\x80\x80", 1, "0x90"),  # above U+10FFFF
                 (b"ok \xe4\xb8z", 5, "0x7A")]   # a truncated 3-byte character
        for data, offset, what in cases:
            with self.subTest(data=data):
                src = os.path.join(self.tmp, "bad.txt")
                with open(src, "wb") as f:
                    f.write(data)
                out = os.path.join(self.tmp, "bad-out")
                p = subprocess.run([KEEL, "prepare", src, "--output", out], capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(p.returncode, 1)
                lines = p.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, p.stderr)
                self.assertIn(f"{src}: invalid UTF-8 at byte offset {offset}", lines[0])
                self.assertIn(what, lines[0])
                self.assertIn("--level byte", lines[0])
                self.assertFalse(os.path.exists(out))

    # ---- the dataset ----------------------------------------------------------------------
    def test_sequential_windows(self):
        meta, tokens = self.load(self.dir)
        for split in ("train", "val"):
            C, B = 16, 4
            info, batches = self.dump(context=C, batch_size=B, sampling="sequential", split=split)
            begin, end = self.split(tokens, split)
            windows = (end - begin - 1) // C
            self.assertEqual(info["batches_per_epoch"], windows // B)
            self.assertEqual(info["size"], windows // B * B)  # the partial batch is dropped
            self.assertEqual(info["tokens_per_sample"], C)
            self.assertEqual(len(batches), windows // B)
            for t, (samples, count, rows, cols) in enumerate(info["batches"]):
                self.assertEqual((samples, count, rows, cols), (B, B * C, B, C))
                for i in range(B):
                    o = begin + (t * B + i) * C
                    np.testing.assert_array_equal(batches[t, 0, i], tokens[o:o + C])
                    np.testing.assert_array_equal(batches[t, 1, i], tokens[o + 1:o + C + 1])
            # Targets are the inputs shifted by one token.
            np.testing.assert_array_equal(batches[:, 1, :, :-1], batches[:, 0, :, 1:])

    def test_splits_do_not_overlap(self):
        _, tokens = self.load(self.dir)
        for fraction in (0.1, 0.25, 0.5):
            C = 32
            used = {}
            for split in ("train", "val"):
                info, batches = self.dump(context=C, batch_size=2, sampling="sequential",
                                          split=split, val_fraction=fraction)
                begin, end = self.split(tokens, split, fraction)
                rows = info["batches_per_epoch"] * 2
                # Window k reads tokens begin + kC .. begin + kC + C (inputs and last target).
                used[split] = (begin, begin + (rows - 1) * C + C + 1)
                self.assertLessEqual(used[split][1], end)
            self.assertLessEqual(used["train"][1], used["val"][0], fraction)
            self.assertEqual(self.split(tokens, "val", fraction)[0],
                             len(tokens) - int(len(tokens) * fraction))

    def test_random_sampling(self):
        _, tokens = self.load(self.dir)
        C, B = 24, 8
        begin, end = self.split(tokens, "train")
        a = self.dump("--seed", 5, "--epoch", 1, context=C, batch_size=B)[1]
        b = self.dump("--seed", 5, "--epoch", 1, context=C, batch_size=B)[1]
        np.testing.assert_array_equal(a, b)  # deterministic per seed and epoch
        other_epoch = self.dump("--seed", 5, "--epoch", 2, context=C, batch_size=B)[1]
        other_seed = self.dump("--seed", 6, "--epoch", 1, context=C, batch_size=B)[1]
        self.assertFalse(np.array_equal(a, other_epoch))
        self.assertFalse(np.array_equal(a, other_seed))
        # The documented generator, sample by sample.
        for t in range(len(a)):
            for i in range(B):
                o = begin + random_offset(5, 1, t * B + i, end - begin - C)
                np.testing.assert_array_equal(a[t, 0, i], tokens[o:o + C])
                np.testing.assert_array_equal(a[t, 1, i], tokens[o + 1:o + C + 1])
        # seek(epoch, batch) gives what replaying start_epoch and `batch` nexts gives.
        info, sought = self.dump("--seed", 5, "--epoch", 1, "--seek", 3, context=C, batch_size=B)
        np.testing.assert_array_equal(sought, a[3:])
        self.assertEqual(len(info["batches"]), info["batches_per_epoch"] - 3)
        # samples_per_epoch sets the epoch's length; the last partial batch is dropped.
        info, batches = self.dump("--seed", 5, context=C, batch_size=B, samples_per_epoch=37)
        self.assertEqual((info["batches_per_epoch"], info["size"], len(batches)), (4, 32, 4))
        self.assertTrue(all(s == [B, B * C, B, C] for s in info["batches"]))
        # The default: as many samples as the split has non-overlapping windows.
        info, _ = self.dump("--batches", 0, context=C, batch_size=B)
        self.assertEqual(info["batches_per_epoch"], (end - begin - 1) // C // B)

    def test_world_size_two(self):
        # Rank r takes the epoch's samples r, r + 2, ...: the ranks' batch t interleaved is
        # batch t of one rank with twice the batch size.
        C, B = 16, 3
        for sampling in ("sequential", "random"):
            one = self.dump("--seed", 9, context=C, batch_size=2 * B, sampling=sampling)[1]
            ranks = [self.dump("--seed", 9, "--rank", r, "--world", 2, context=C, batch_size=B,
                               sampling=sampling)[1] for r in (0, 1)]
            self.assertEqual(len(ranks[0]), len(one))
            self.assertEqual(len(ranks[1]), len(one))
            merged = np.empty_like(one)
            merged[:, :, 0::2] = ranks[0]
            merged[:, :, 1::2] = ranks[1]
            np.testing.assert_array_equal(merged, one, sampling)

    def test_uint32_file(self):
        d = os.path.join(self.tmp, "wide65537")
        if not os.path.exists(d):
            self.test_dtype_boundary()
        meta, tokens = self.load(d)
        self.assertEqual(meta["dtype"], "uint32")
        C, B = 100, 5
        info, batches = self.dump(context=C, batch_size=B, sampling="sequential",
                                  path=os.path.join(d, "tokens.bin"))
        self.assertGreater(int(batches.max()), 65535)
        for t in range(len(batches)):
            for i in range(B):
                o = (t * B + i) * C
                np.testing.assert_array_equal(batches[t, 0, i], tokens[o:o + C])
                np.testing.assert_array_equal(batches[t, 1, i], tokens[o + 1:o + C + 1])

    def test_bad_files(self):
        bad = os.path.join(self.tmp, "badfiles")
        os.makedirs(bad, exist_ok=True)
        vocab = {"format": "keel-tokens", "version": 1, "level": "char", "dtype": "uint16",
                 "size": 10, "tokens": 100, "vocab": list("0123456789")}
        with open(os.path.join(bad, "vocab.json"), "w") as f:
            json.dump(vocab, f)
        ids = np.arange(100, dtype="<u2") % 10
        ids[77] = 12
        ids.tofile(os.path.join(bad, "big_id.bin"))
        with open(os.path.join(bad, "odd.bin"), "wb") as f:
            f.write(b"\0" * 41)
        (np.arange(100, dtype="<u2") % 10).tofile(os.path.join(bad, "ok.bin"))
        p = lambda n: os.path.join(bad, n)
        line = self.dump(path=p("big_id.bin"), context=4, batch_size=1, val_fraction=0,
                         expect_ok=False)
        self.assertIn(p("big_id.bin") + ": token 77 is id 12, outside the vocabulary of 10", line)
        line = self.dump(path=p("odd.bin"), context=4, expect_ok=False)
        self.assertIn(p("odd.bin") + ": size 41 bytes is not a multiple of 2", line)
        line = self.dump(path=p("ok.bin"), context=10, split="val", expect_ok=False)
        self.assertIn(p("ok.bin") + ": split 'val' holds 10 tokens (of 100", line)
        self.assertIn("context 10", line)
        line = self.dump(path=p("nope.bin"), context=4, expect_ok=False)
        self.assertIn(p("nope.bin") + ": cannot open the token file", line)
        line = self.dump(path=os.path.join(self.tmp, "nodir", "x.bin"), context=4,
                         expect_ok=False)
        self.assertIn(os.path.join(self.tmp, "nodir", "vocab.json"), line)
        self.assertIn("keel prepare", line)
        line = self.dump(path=p("ok.bin"), context=4, sampling="sequential",
                         samples_per_epoch=5, expect_ok=False)
        self.assertIn("samples_per_epoch", line)
        line = self.dump(path=p("ok.bin"), context=4, batch_size=50, expect_ok=False)
        self.assertIn("no batch", line)

    def test_validate_manifest(self):
        m = os.path.join(self.tmp, "lm.toml")
        with open(m, "w") as f:
            f.write(f"""[run]
name = "lm"
output_dir = "{self.tmp}/runs"
[train]
epochs = 1
[model]
type = "mlp"
input_shape = [16]
num_classes = {self.load(self.dir)[0]["size"]}
[data.train]
type = "tokens"
path = "corpus/tokens.bin"
context = 16
batch_size = 4
[optimizer]
type = "sgd"
lr = 0.1
[loss]
type = "cross_entropy"
""")
        p = subprocess.run([KEEL, "validate", m], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(": ok", p.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[4:], verbosity=2)
