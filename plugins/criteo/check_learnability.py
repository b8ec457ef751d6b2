# The learnability check of docs/recommendation.md ("Data", "The generator"): a DLRM-like
# PyTorch model trained for one pass over day_000 .. day_006 of a keel-criteo-generate output
# (plain .tsv windows, 8 of them), then the exact AUC of day_007 against truth.json's Bayes AUC.
#   /usr/bin/python3 plugins/criteo/check_learnability.py DIR [SPARSE_LR (0.1)] [BATCH (512)]
# Prints the test AUC after each training window and the Bayes AUC of the test window. Not a
# test (it takes minutes); keel's own model is plugins/ctr's dlrm.
import json, sys, time, numpy as np, torch, torch.nn as nn
torch.set_num_threads(2); torch.manual_seed(0)
d = sys.argv[1]; W = 8; dim = 8; lr_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1; B = int(sys.argv[3]) if len(sys.argv) > 3 else 512
def load(w):
    rows = [l.rstrip('\n').split('\t') for l in open(f'{d}/day_{w:03d}.tsv')]
    y = np.array([float(r[0]) for r in rows], dtype=np.float32)
    x = np.array([[np.log1p(max(int(v), 0)) if v else 0.0 for v in r[1:14]] for r in rows], dtype=np.float32)
    c = np.array([[int(v, 16) if v else -1 for v in r[14:]] for r in rows], dtype=np.int64)
    return x, c, y
t0 = time.time(); data = [load(w) for w in range(W)]; print(f'loaded {time.time()-t0:.0f}s', flush=True)
# global row index per (feature, id): 0 = missing/unseen
allc = np.concatenate([data[w][1] for w in range(W - 1)])
maps = []; off = 1
for j in range(26):
    u = np.unique(allc[:, j]); u = u[u >= 0]; maps.append((u, off)); off += len(u)
def index(c):
    out = np.zeros_like(c)
    for j, (u, o) in enumerate(maps):
        pos = np.searchsorted(u, c[:, j]); pos = np.minimum(pos, len(u) - 1)
        hit = (c[:, j] >= 0) & (u[pos] == c[:, j]); out[:, j] = np.where(hit, pos + o, 0)
    return torch.tensor(out)
class M(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(off, dim, sparse=True, padding_idx=0); nn.init.normal_(s.emb.weight, 0, 0.01)
        with torch.no_grad(): s.emb.weight[0].zero_()
        s.bot = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU())
        s.top = nn.Sequential(nn.Linear(351 + dim, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
        s.iu = torch.triu_indices(27, 27, 1)
    def forward(s, x, c):
        z = s.bot(x); T = torch.cat([z.unsqueeze(1), s.emb(c)], 1); Z = T @ T.transpose(1, 2)
        return s.top(torch.cat([z, Z[:, s.iu[0], s.iu[1]]], 1)).squeeze(1)
def auc(p, y):
    o = np.argsort(p, kind='mergesort'); r = np.empty(len(p)); r[o] = np.arange(1, len(p) + 1)
    pos = y.sum(); return (r[y == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos))
m = M(); so = torch.optim.Adagrad([m.emb.weight], lr=lr_s)
do = torch.optim.Adam(list(m.bot.parameters()) + list(m.top.parameters()), lr=1e-3)
xt, ct, yt = data[W - 1]; ct = index(ct); xt = torch.tensor(xt)
t0 = time.time()
for w in range(W - 1):
    x, c, y = data[w]; c = index(c); x = torch.tensor(x); y = torch.tensor(y)
    for i in range(0, len(y), B):
        l = nn.functional.binary_cross_entropy_with_logits(m(x[i:i+B], c[i:i+B]), y[i:i+B])
        so.zero_grad(); do.zero_grad(); l.backward(); so.step(); do.step()
    with torch.no_grad(): p = torch.sigmoid(m(xt, ct)).numpy()
    print(f'after window {w}: test AUC {auc(p, yt):.4f}, {time.time()-t0:.0f}s', flush=True)
t = json.load(open(f'{d}/truth.json'))
print('Bayes AUC of test window', t['per_window'][W-1]['bayes_auc'])
