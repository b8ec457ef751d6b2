"""keel-criteo-generate (plugins/criteo/generate.cpp): deterministic from --seed, Criteo-format
lines, and truth.json consistent with the files it wrote: the Bayes AUC and log loss recomputed
here from the written labels and the true probabilities (--probabilities).

Usage: test_criteo_generate.py GENERATOR
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

GEN = sys.argv[1]


def run(*args):
    return subprocess.run([GEN, *args], capture_output=True, text=True)


def generate(out, *extra):
    r = run("--output", out, "--windows", "3", "--records", "2000", *extra)
    assert r.returncode == 0, r.stderr
    return out


def files(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, f))}


def auc(p, y):  # exact, ties counted half (midranks)
    order = sorted(range(len(p)), key=lambda i: p[i])
    rank_sum, pos, i = 0.0, 0, 0
    while i < len(order):
        j = i
        while j < len(order) and p[order[j]] == p[order[i]]:
            j += 1
        mid = (i + 1 + j) / 2
        for k in range(i, j):
            if y[order[k]]:
                rank_sum += mid
                pos += 1
        i = j
    neg = len(p) - pos
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def check_truth(d):
    truth = json.load(open(os.path.join(d, "truth.json")))
    assert truth["format"] == "keel-criteo-truth" and truth["version"] == 1
    assert truth["seed"] == 7 and truth["windows"] == 3
    all_p, all_y = [], []
    for w, s in enumerate(truth["per_window"]):
        assert s["file"] == f"day_{w:03d}.tsv", s
        lines = open(os.path.join(d, s["file"])).read().split("\n")
        assert lines[-1] == ""
        lines = lines[:-1]
        y = []
        for line in lines:
            f = line.split("\t")
            assert len(f) == 40, line
            assert f[0] in ("0", "1")
            for v in f[1:14]:
                assert v == "" or int(v) == int(v)
            for v in f[14:]:
                assert v == "" or (len(v) == 8 and int(v, 16) >= 0), v
            y.append(int(f[0]))
        p = [float(v) for v in open(os.path.join(d, "probabilities", f"day_{w:03d}.txt"))]
        assert len(p) == len(y) == s["records"] == 2000
        assert all(0 < q < 1 for q in p)
        assert abs(auc(p, y) - s["bayes_auc"]) < 1e-12, (auc(p, y), s)
        ll = -sum(math.log(q if t else 1 - q) for q, t in zip(p, y)) / len(y)
        assert abs(ll - s["bayes_log_loss"]) < 1e-12
        assert abs(sum(y) / len(y) - s["click_rate"]) < 1e-15
        # Labels are drawn from p: the click rate is near the mean probability.
        mean = sum(p) / len(p)
        assert abs(s["click_rate"] - mean) < 4 * math.sqrt(mean * (1 - mean) / len(p)), s
        all_p += p
        all_y += y
    o = truth["overall"]
    assert o["records"] == 6000
    assert abs(auc(all_p, all_y) - o["bayes_auc"]) < 1e-12
    assert 0.6 < o["bayes_auc"] < 0.95, o  # a signal to learn, not a trivial one
    params = truth["parameters"]
    assert len(params["categorical"]) == 26 and len(params["numeric"]) == 13
    assert all(c["cardinality"] >= 1 for c in params["categorical"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        a = generate(os.path.join(tmp, "a"), "--seed", "7", "--probabilities")
        b = generate(os.path.join(tmp, "b"), "--seed", "7", "--probabilities")
        c = generate(os.path.join(tmp, "c"), "--seed", "8")
        z = generate(os.path.join(tmp, "z"), "--seed", "7", "--zstd")
        fa, fb, fc, fz = files(a), files(b), files(c), files(z)
        assert fa == fb, "the same --seed wrote different files"
        assert sorted(fa) == ["day_000.tsv", "day_001.tsv", "day_002.tsv", "truth.json"]
        assert fa["day_000.tsv"] != fc["day_000.tsv"], "another --seed wrote the same window"
        assert sorted(fz) == ["day_000.tsv.zst", "day_001.tsv.zst", "day_002.tsv.zst",
                              "truth.json"]
        assert not [f for f in os.listdir(a) if f.startswith(".")], "a temporary file was left"
        ta, tz = json.loads(fa["truth.json"]), json.loads(fz["truth.json"])
        for s, sz in zip(ta["per_window"], tz["per_window"]):
            assert sz["file"] == s["file"] + ".zst" and sz["bayes_auc"] == s["bayes_auc"]
        if shutil.which("zstd"):  # the compressed windows hold the same text
            for f in ("day_000.tsv", "day_002.tsv"):
                text = subprocess.run(["zstd", "-dc", os.path.join(z, f + ".zst")],
                                      capture_output=True, check=True).stdout
                assert text == fa[f]
        check_truth(a)
        # Errors: one line, exit 2, a hint.
        for args, what in ((["--windows", "3"], "needs --output DIR"),
                           (["--output", tmp, "--records", "x"], "--records x: not an integer"),
                           (["--output", tmp, "--bogus"], "--bogus: unknown argument")):
            r = run(*args)
            assert r.returncode == 2 and what in r.stderr and "hint:" in r.stderr, (args, r)
            assert r.stderr.count("\n") == 1, r.stderr
    print("ok")


main()
