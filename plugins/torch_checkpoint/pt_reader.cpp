#include "pt_reader.hpp"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace keel_torch_pt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("'" + path + "': " + what);
}

// Text from the file, for a message: printable ASCII, at most 60 bytes, quoted.
std::string shown(const std::string& s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += '?';
  }
  if (s.size() > 60) out += "...";
  return out + "'";
}

// ---- the zip archive -----------------------------------------------------------------------

struct Record {
  uint64_t begin = 0, size = 0;
};

class Bytes {
 public:
  Bytes(const std::vector<char>& b, const std::string& path) : b_(b), path_(path) {}
  uint64_t size() const { return b_.size(); }
  uint64_t u(uint64_t pos, int n, const char* what) const {
    if (pos > b_.size() || static_cast<uint64_t>(n) > b_.size() - pos)
      fail(path_, std::string("its zip ") + what + " lies past the end of the file (truncated?)");
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[pos + i]);
    return v;
  }
  std::string str(uint64_t pos, uint64_t n, const char* what) const {
    if (pos > b_.size() || n > b_.size() - pos)
      fail(path_, std::string("its zip ") + what + " lies past the end of the file (truncated?)");
    return std::string(b_.data() + pos, n);
  }

 private:
  const std::vector<char>& b_;
  const std::string& path_;
};

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                   kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

// The archive's records by name: each stored (method 0, not encrypted), its data inside the
// file and before the central directory, each name once.
std::map<std::string, Record> read_zip(const std::vector<char>& file, const std::string& path) {
  const Bytes b(file, path);
  const char* const kNotZip = "not a zip archive (no end-of-central-directory record at its end: "
                              "truncated, or not a .pt file)";
  if (b.size() < 22) fail(path, kNotZip);
  // The end record is the last 22 bytes plus its comment: search back over at most 64 KiB.
  uint64_t end = UINT64_MAX;
  for (uint64_t pos = b.size() - 22;; --pos) {
    if (b.u(pos, 4, "end record") == kEndSig && pos + 22 + b.u(pos + 20, 2, "end record") == b.size()) {
      end = pos;
      break;
    }
    if (pos == 0 || b.size() - 22 - pos >= 0xFFFF) break;
  }
  if (end == UINT64_MAX) fail(path, kNotZip);
  if (b.u(end + 4, 2, "end record") != 0 || b.u(end + 6, 2, "end record") != 0)
    fail(path, "a multi-disk zip archive");
  uint64_t count = b.u(end + 10, 2, "end record");
  uint64_t cd_size = b.u(end + 12, 4, "end record");
  uint64_t cd_off = b.u(end + 16, 4, "end record");
  uint64_t cd_limit = end;  // the central directory ends before this
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_off == 0xFFFFFFFF) {  // zip64
    if (end < 20 || b.u(end - 20, 4, "zip64 locator") != kLocator64Sig)
      fail(path, "its zip end record asks for a zip64 record that is not there");
    const uint64_t e64 = b.u(end - 20 + 8, 8, "zip64 locator");
    if (e64 > end - 20 || b.u(e64, 4, "zip64 end record") != kEnd64Sig)
      fail(path, "its zip64 locator points at no zip64 end record");
    count = b.u(e64 + 32, 8, "zip64 end record");
    cd_size = b.u(e64 + 40, 8, "zip64 end record");
    cd_off = b.u(e64 + 48, 8, "zip64 end record");
    cd_limit = e64;
  }
  if (cd_off > cd_limit || cd_size > cd_limit - cd_off)
    fail(path, "its zip central directory lies outside the file");
  if (count > cd_size / 46) fail(path, "its zip end record counts more entries than fit");

  std::map<std::string, Record> records;
  uint64_t p = cd_off;
  const uint64_t cd_end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_end - p < 46 || b.u(p, 4, "central directory") != kCentralSig)
      fail(path, "its zip central directory is damaged at entry " + std::to_string(i));
    const uint64_t flags = b.u(p + 8, 2, "central directory");
    const uint64_t method = b.u(p + 10, 2, "central directory");
    uint64_t csize = b.u(p + 20, 4, "central directory");
    uint64_t usize = b.u(p + 24, 4, "central directory");
    const uint64_t nlen = b.u(p + 28, 2, "central directory");
    const uint64_t elen = b.u(p + 30, 2, "central directory");
    const uint64_t clen = b.u(p + 32, 2, "central directory");
    uint64_t local = b.u(p + 42, 4, "central directory");
    if (cd_end - p - 46 < nlen + elen + clen)
      fail(path, "its zip central directory is damaged at entry " + std::to_string(i));
    const std::string name = b.str(p + 46, nlen, "central directory");
    // zip64 sizes and offset: in the extra field, in this order, each only where the 32-bit
    // field holds 0xFFFFFFFF.
    if (usize == 0xFFFFFFFF || csize == 0xFFFFFFFF || local == 0xFFFFFFFF) {
      uint64_t x = p + 46 + nlen;
      const uint64_t x_end = x + elen;
      bool found = false;
      while (x_end - x >= 4) {
        const uint64_t id = b.u(x, 2, "extra field"), len = b.u(x + 2, 2, "extra field");
        if (x_end - x - 4 < len) break;
        if (id == 1) {
          uint64_t q = x + 4;
          const uint64_t q_end = q + len;
          for (uint64_t* field : {&usize, &csize, &local})
            if (*field == 0xFFFFFFFF) {
              if (q_end - q < 8) fail(path, "record " + shown(name) + ": a short zip64 field");
              *field = b.u(q, 8, "extra field");
              q += 8;
            }
          found = true;
          break;
        }
        x += 4 + len;
      }
      if (!found) fail(path, "record " + shown(name) + ": its zip64 sizes are missing");
    }
    p += 46 + nlen + elen + clen;

    const std::string rec = "record " + shown(name);
    if (flags & 1) fail(path, rec + " is encrypted");
    if (method != 0 || csize != usize)
      fail(path, rec + " is compressed (zip method " + std::to_string(method) +
                     "); keel and torch.save store records uncompressed");
    if (local > cd_off || cd_off - local < 30 || b.u(local, 4, "local header") != kLocalSig)
      fail(path, rec + ": its zip local header is missing or damaged");
    const uint64_t lnlen = b.u(local + 26, 2, "local header");
    const uint64_t lelen = b.u(local + 28, 2, "local header");
    if (b.str(local + 30, lnlen, "local header") != name)
      fail(path, rec + ": its local header names another record");
    const uint64_t data = local + 30 + lnlen + lelen;
    if (data > cd_off || usize > cd_off - data)
      fail(path, rec + ": its data lies outside the file's records (truncated?)");
    if (!records.emplace(name, Record{data, usize}).second)
      fail(path, rec + " appears twice in the zip archive");
  }
  if (records.empty()) fail(path, "an empty zip archive");
  return records;
}

// ---- the pickle ----------------------------------------------------------------------------

struct Node;
using Ref = std::shared_ptr<Node>;

struct Node {
  enum Kind { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kGlobal, kStorage, kTensor } kind;
  explicit Node(Kind k) : kind(k) {}
  int64_t i = 0;                 // kBool, kInt (a kFloat's value is not kept: keel loads tensors)
  std::string s;                 // kStr; kGlobal: "module.name"; kStorage: its key
  std::vector<Ref> items;        // kTuple, kList; kDict: key, value, key, value, ...
  std::set<std::string> keys;    // kDict: its keys as text (an int key in decimal), each once
  bool ordered = false;          // kDict made by collections.OrderedDict()
  bool frozen = false;           // placed inside another value: no longer changed (so no value
                                 // holds itself, however deep)
  int depth = 1;                 // nesting, bounded so that no recursion runs deep
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // kGlobal (a storage class), kStorage
  uint64_t numel = 0;                                    // kStorage
  // kTensor
  Ref storage;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
};

const char* kind_name(const Node& n) {
  switch (n.kind) {
    case Node::kNone: return "None";
    case Node::kBool: return "a bool";
    case Node::kInt: return "an int";
    case Node::kFloat: return "a float";
    case Node::kStr: return "a string";
    case Node::kTuple: return "a tuple";
    case Node::kList: return "a list";
    case Node::kDict: return "a dict";
    case Node::kGlobal: return "a global";
    case Node::kStorage: return "a storage";
    case Node::kTensor: return "a tensor";
  }
  return "?";
}

// A dict key as text: a string, or an int in decimal (an optimizer's state is keyed by the
// parameters' indices).
std::string key_text(const Node& k) { return k.kind == Node::kInt ? std::to_string(k.i) : k.s; }

constexpr int kMaxDepth = 16;
constexpr size_t kMaxDims = 64;
// Naming the tensors walks the values from the root; a value the memo places in several others
// is walked each time, so that a pickle of a few KB could ask for 2^64 steps or names of GBs:
// at most this many values walked, and this many bytes in the names of all values walked.
constexpr uint64_t kMaxVisits = uint64_t{1} << 22;
constexpr uint64_t kMaxNameBytes = uint64_t{64} << 20;

// The globals data.pkl may name: what keel, torch::pickle_save and Python's torch.save (1.x and
// 2.x) write for dicts of CPU tensors and parameters, and nothing that runs code beyond
// rebuilding them.
const char* const kRebuildTensor = "torch._utils._rebuild_tensor_v2";
const char* const kRebuildParameter = "torch._utils._rebuild_parameter";
const char* const kOrderedDict = "collections.OrderedDict";
const char* const kRestoreTypeTag = "torch.jit._pickle.restore_type_tag";
const std::map<std::string, c10::ScalarType>& storage_classes() {
  using c10::ScalarType;
  static const std::map<std::string, ScalarType> m = {
      {"torch.DoubleStorage", ScalarType::Double},   {"torch.FloatStorage", ScalarType::Float},
      {"torch.HalfStorage", ScalarType::Half},       {"torch.BFloat16Storage", ScalarType::BFloat16},
      {"torch.LongStorage", ScalarType::Long},       {"torch.IntStorage", ScalarType::Int},
      {"torch.ShortStorage", ScalarType::Short},     {"torch.CharStorage", ScalarType::Char},
      {"torch.ByteStorage", ScalarType::Byte},       {"torch.BoolStorage", ScalarType::Bool},
      {"torch.ComplexFloatStorage", ScalarType::ComplexFloat},
      {"torch.ComplexDoubleStorage", ScalarType::ComplexDouble},
  };
  return m;
}

// Bytes per element: c10::elementSize's own table (the same macro), without its TORCH_CHECK for
// an unknown type, whose failure path lives in libc10: this file needs LibTorch's headers only
// (tests/fuzz/fuzz_pt_reader links it without LibTorch). 0 for a type outside the table, which
// no storage class above maps to.
uint64_t element_size(c10::ScalarType t) {
#define KEEL_PT_ELEMENT_SIZE(ctype, name) \
  case c10::ScalarType::name:             \
    return sizeof(ctype);
  switch (t) {
    AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(KEEL_PT_ELEMENT_SIZE)
    default:
      return 0;
  }
#undef KEEL_PT_ELEMENT_SIZE
}

std::string dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

class Unpickler {
 public:
  Unpickler(const char* data, uint64_t size, const std::string& path)
      : d_(data), n_(size), path_(path) {}

  Ref run() {
    for (;;) {
      at_ = pos_;
      const unsigned char op = byte();
      switch (op) {
        case 0x80:  // PROTO
          if (byte() != 2) bad("pickle protocol other than 2");
          break;
        case 'c': {  // GLOBAL
          std::string module = line(), name = line();
          const std::string full = module + "." + name;
          auto g = std::make_shared<Node>(Node::kGlobal);
          const auto sc = storage_classes().find(full);
          if (sc != storage_classes().end()) g->dtype = sc->second;
          else if (full != kRebuildTensor && full != kRebuildParameter && full != kOrderedDict &&
                   full != kRestoreTypeTag)
            bad("global " + shown(full) + ", which is not on keel's allow-list (" +
                kRebuildTensor + ", " + kRebuildParameter + ", " + kOrderedDict + ", " +
                kRestoreTypeTag + ", torch.<Type>Storage)");
          g->s = full;
          push(g);
          break;
        }
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case ')': push(tuple({})); break;                  // EMPTY_TUPLE
        case 't': push(tuple(pop_mark())); break;          // TUPLE
        case 0x85: case 0x86: case 0x87: {                 // TUPLE1..3
          const size_t k = op - 0x84u;
          if (stack_.size() - base() < k) bad("a tuple of more values than the stack holds");
          std::vector<Ref> items(stack_.end() - k, stack_.end());
          stack_.resize(stack_.size() - k);
          push(tuple(std::move(items)));
          break;
        }
        case '}': push(std::make_shared<Node>(Node::kDict)); break;  // EMPTY_DICT
        case ']': push(std::make_shared<Node>(Node::kList)); break;  // EMPTY_LIST
        case 'a': {                                                   // APPEND
          Ref v = pop();
          append(top(), {v});
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Ref> items = pop_mark();
          append(top(), items);
          break;
        }
        case 'G':  // BINFLOAT: 8 bytes (an optimizer's lr, betas, eps: not kept)
          need(8);
          pos_ += 8;
          push(std::make_shared<Node>(Node::kFloat));
          break;
        case 's': {                                                   // SETITEM
          Ref v = pop(), k = pop();
          set_items(top(), {k, v});
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Ref> kv = pop_mark();
          set_items(top(), kv);
          break;
        }
        case 'N': push(std::make_shared<Node>(Node::kNone)); break;
        case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
          auto b = std::make_shared<Node>(Node::kBool);
          b->i = op == 0x88;
          push(b);
          break;
        }
        case 'K': push(integer(static_cast<int64_t>(fixed(1)))); break;  // BININT1
        case 'M': push(integer(static_cast<int64_t>(fixed(2)))); break;  // BININT2
        case 'J':                                                         // BININT
          push(integer(static_cast<int32_t>(static_cast<uint32_t>(fixed(4)))));
          break;
        case 0x8a: {  // LONG1: n bytes, two's complement, little-endian
          const uint64_t k = byte();
          if (k > 8) bad("an integer wider than 64 bits");
          uint64_t v = fixed(static_cast<int>(k));
          if (k > 0 && k < 8 && (v >> (8 * k - 1)) & 1) v |= ~uint64_t{0} << (8 * k);  // sign
          push(integer(static_cast<int64_t>(v)));
          break;
        }
        case 'X': {  // BINUNICODE
          const uint64_t len = fixed(4);
          need(len);
          auto s = std::make_shared<Node>(Node::kStr);
          s->s.assign(d_ + pos_, len);
          pos_ += len;
          push(s);
          break;
        }
        case 'q': memo_[fixed(1)] = top(); break;  // BINPUT
        case 'r': memo_[fixed(4)] = top(); break;  // LONG_BINPUT
        case 'h': case 'j': {                      // BINGET, LONG_BINGET
          const auto it = memo_.find(fixed(op == 'h' ? 1 : 4));
          if (it == memo_.end()) bad("a memo read of a slot never written");
          push(it->second);
          break;
        }
        case 'Q': push(storage(pop())); break;  // BINPERSID
        case 'R': {                             // REDUCE
          Ref args = pop(), callable = pop();
          push(reduce(callable, args));
          break;
        }
        case 'b': {  // BUILD: only an OrderedDict's attributes (a state dict's _metadata),
                     // which keel does not use
          Ref state = pop();
          const Ref& obj = top();
          if (obj->kind != Node::kDict || !obj->ordered ||
              (state->kind != Node::kDict && state->kind != Node::kNone))
            bad("BUILD of " + std::string(kind_name(*obj)) + " with " + kind_name(*state) +
                " (only an OrderedDict's attributes are accepted)");
          break;
        }
        case '.':  // STOP
          if (stack_.size() != 1 || !marks_.empty())
            bad("STOP with " + std::to_string(stack_.size()) + " values and " +
                std::to_string(marks_.size()) + " marks on the stack (one value expected)");
          return stack_.back();
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          bad(std::string("pickle opcode ") + hex + ", which is not one keel's or torch.save's "
              "state dicts use");
        }
      }
    }
  }

  const std::map<std::string, Ref>& storages() const { return storages_; }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(path_, "data.pkl, byte " + std::to_string(at_) + ": " + what);
  }
  void need(uint64_t k) const {
    if (k > n_ - pos_) bad("the pickle ends early (truncated?)");
  }
  unsigned char byte() {
    need(1);
    return static_cast<unsigned char>(d_[pos_++]);
  }
  uint64_t fixed(int k) {
    need(static_cast<uint64_t>(k));
    uint64_t v = 0;
    for (int j = k - 1; j >= 0; --j) v = (v << 8) | static_cast<unsigned char>(d_[pos_ + j]);
    pos_ += static_cast<uint64_t>(k);
    return v;
  }
  std::string line() {
    const void* nl = std::memchr(d_ + pos_, '\n', std::min<uint64_t>(n_ - pos_, 256));
    if (nl == nullptr) bad("a GLOBAL without its two lines");
    const uint64_t len = static_cast<const char*>(nl) - (d_ + pos_);
    std::string s(d_ + pos_, len);
    pos_ += len + 1;
    return s;
  }
  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Ref r) {
    if (stack_.size() >= (1u << 20)) bad("a pickle stack of over a million values");
    stack_.push_back(std::move(r));
  }
  Ref pop() {
    if (stack_.size() <= base()) bad("a pop from an empty stack");
    Ref r = std::move(stack_.back());
    stack_.pop_back();
    return r;
  }
  const Ref& top() const {
    if (stack_.size() <= base()) bad("a read from an empty stack");
    return stack_.back();
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) bad("no MARK to pop to");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  void adopt(Node& parent, const Ref& child) {
    child->frozen = true;
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxDepth) bad("values nested over " + std::to_string(kMaxDepth) + " deep");
  }
  Ref tuple(std::vector<Ref> items) {
    auto t = std::make_shared<Node>(Node::kTuple);
    for (const Ref& r : items) adopt(*t, r);
    t->items = std::move(items);
    return t;
  }
  Ref integer(int64_t v) {
    auto r = std::make_shared<Node>(Node::kInt);
    r->i = v;
    return r;
  }
  void set_items(const Ref& dict, const std::vector<Ref>& kv) {
    if (dict->kind != Node::kDict) bad("SETITEM(S) on " + std::string(kind_name(*dict)));
    if (dict->frozen) bad("SETITEM(S) on a dict already placed inside another value");
    if (kv.size() % 2 != 0) bad("SETITEMS with an odd number of values");
    for (size_t j = 0; j < kv.size(); j += 2) {
      if (kv[j]->kind != Node::kStr && kv[j]->kind != Node::kInt)
        bad(std::string("a dict key that is ") + kind_name(*kv[j]));
      if (kv[j + 1] == dict) bad("a dict inside itself");
      const std::string key = key_text(*kv[j]);
      if (!dict->keys.insert(key).second) bad("the dict key " + shown(key) + " twice");
      adopt(*dict, kv[j]);
      adopt(*dict, kv[j + 1]);
      dict->items.push_back(kv[j]);
      dict->items.push_back(kv[j + 1]);
    }
  }
  void append(const Ref& list, const std::vector<Ref>& items) {
    if (list->kind != Node::kList) bad("APPEND(S) on " + std::string(kind_name(*list)));
    if (list->frozen) bad("APPEND(S) on a list already placed inside another value");
    for (const Ref& v : items) {
      if (v == list) bad("a list inside itself");
      adopt(*list, v);
      list->items.push_back(v);
    }
  }
  // BINPERSID: ('storage', torch.<Type>Storage, key, location, numel).
  Ref storage(const Ref& pid) {
    const std::vector<Ref>& t = pid->items;
    if (pid->kind != Node::kTuple || t.size() != 5 || t[0]->kind != Node::kStr ||
        t[0]->s != "storage" || t[1]->kind != Node::kGlobal ||
        t[1]->dtype == c10::ScalarType::Undefined || t[2]->kind != Node::kStr ||
        t[3]->kind != Node::kStr || t[4]->kind != Node::kInt || t[4]->i < 0)
      bad("a persistent id that is not ('storage', torch.<Type>Storage, key, location, numel)");
    const std::string& loc = t[3]->s;
    if (loc != "cpu" && loc.rfind("cuda", 0) != 0)
      bad("a storage on device " + shown(loc) + " (cpu or cuda expected)");
    const std::string& key = t[2]->s;
    if (key.empty() || key.size() > 32 || key.find_first_not_of("0123456789") != std::string::npos)
      bad("a storage key " + shown(key) + " (a decimal number expected)");
    auto it = storages_.find(key);
    if (it != storages_.end()) {  // a storage shared by several tensors: the same each time
      if (it->second->dtype != t[1]->dtype || it->second->numel != static_cast<uint64_t>(t[4]->i))
        bad("storage " + shown(key) + " named twice with different types or sizes");
      return it->second;
    }
    auto s = std::make_shared<Node>(Node::kStorage);
    s->s = key;
    s->dtype = t[1]->dtype;
    s->numel = static_cast<uint64_t>(t[4]->i);
    storages_.emplace(key, s);
    return s;
  }
  std::vector<int64_t> ints(const Ref& t, const char* what) {
    if (t->kind != Node::kTuple) bad(std::string("a tensor whose ") + what + " is not a tuple");
    if (t->items.size() > kMaxDims) bad(std::string("a tensor with over 64 ") + what);
    std::vector<int64_t> v;
    for (const Ref& r : t->items) {
      if (r->kind != Node::kInt) bad(std::string("a tensor whose ") + what + " hold " + kind_name(*r));
      v.push_back(r->i);
    }
    return v;
  }
  Ref reduce(const Ref& callable, const Ref& args) {
    if (callable->kind != Node::kGlobal || args->kind != Node::kTuple)
      bad("REDUCE of " + std::string(kind_name(*callable)) + " with " + kind_name(*args));
    const std::vector<Ref>& a = args->items;
    if (callable->s == kOrderedDict) {
      if (!a.empty()) bad("collections.OrderedDict called with arguments");
      auto d = std::make_shared<Node>(Node::kDict);
      d->ordered = true;
      return d;
    }
    if (callable->s == kRestoreTypeTag) {
      if (a.size() != 2 || a[0]->kind != Node::kDict || a[1]->kind != Node::kStr ||
          a[1]->s != "Dict[str, Tensor]")
        bad("restore_type_tag of anything but a Dict[str, Tensor]");
      return a[0];
    }
    if (callable->s == kRebuildTensor) return tensor(a);
    // _rebuild_parameter(tensor, requires_grad, backward_hooks): an nn.Parameter saved as it is
    // (torch.save of a dict holding parameters), loaded as its tensor.
    if (callable->s == kRebuildParameter) {
      if (a.size() != 3 || a[0]->kind != Node::kTensor || a[1]->kind != Node::kBool ||
          a[2]->kind != Node::kDict || !a[2]->items.empty())
        bad("_rebuild_parameter called with other arguments than (tensor, requires_grad, empty "
            "hooks)");
      return a[0];
    }
    bad("a call of " + shown(callable->s));
  }
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks):
  // the view must lie inside its storage, computed without overflow.
  Ref tensor(const std::vector<Ref>& a) {
    if (a.size() != 6 || a[0]->kind != Node::kStorage || a[1]->kind != Node::kInt ||
        a[4]->kind != Node::kBool || a[5]->kind != Node::kDict || !a[5]->items.empty())
      bad("_rebuild_tensor_v2 called with other arguments than (storage, offset, size, stride, "
          "requires_grad, empty hooks)");
    auto t = std::make_shared<Node>(Node::kTensor);
    t->storage = a[0];
    t->offset = a[1]->i;
    t->sizes = ints(a[2], "sizes");
    t->strides = ints(a[3], "strides");
    t->dtype = a[0]->dtype;
    const std::string geometry = "a tensor of sizes " + dims(t->sizes) + ", strides " +
                                 dims(t->strides) + ", storage offset " +
                                 std::to_string(t->offset) + " on storage " + shown(a[0]->s) +
                                 " of " + std::to_string(a[0]->numel) + " elements";
    if (t->sizes.size() != t->strides.size())
      bad(geometry + ": sizes and strides differ in length");
    if (t->offset < 0) bad(geometry + ": a negative storage offset");
    bool empty = false;
    for (size_t k = 0; k < t->sizes.size(); ++k) {
      if (t->sizes[k] < 0) bad(geometry + ": a negative size");
      if (t->strides[k] < 0) bad(geometry + ": a negative stride");
      empty = empty || t->sizes[k] == 0;
    }
    if (empty) {
      if (static_cast<uint64_t>(t->offset) > a[0]->numel)
        bad(geometry + ": the offset lies past the storage's end");
      return t;
    }
    // The last element the view reaches: offset + sum((size - 1) * stride).
    uint64_t last = static_cast<uint64_t>(t->offset);
    for (size_t k = 0; k < t->sizes.size(); ++k) {
      uint64_t step = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(t->sizes[k] - 1),
                                 static_cast<uint64_t>(t->strides[k]), &step) ||
          __builtin_add_overflow(last, step, &last) || last > static_cast<uint64_t>(INT64_MAX))
        bad(geometry + ": its extent overflows 64 bits");
    }
    if (last >= a[0]->numel)
      bad(geometry + ": it reaches element " + std::to_string(last) + ", past the storage's end");
    // No more elements than the storage record holds: a view repeating elements beyond that
    // (stride 0, overlapping strides) would claim more memory than the file holds bytes (a
    // 2.5 KB file of [2^28, 2] at stride 0 had --resume touch 2 GB).
    uint64_t numel = 1;
    for (const int64_t n : t->sizes)
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(n), &numel))
        bad(geometry + ": its element count overflows 64 bits");
    if (numel > a[0]->numel)
      bad(geometry + ": its " + std::to_string(numel) + " elements are more than its storage "
          "holds (a view repeating elements, such as stride 0, is not a tensor keel loads)");
    return t;
  }

  const char* d_;
  uint64_t n_, pos_ = 0, at_ = 0;
  const std::string& path_;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Ref> memo_;
  std::map<std::string, Ref> storages_;
};

}  // namespace

std::vector<TensorSpec> read_pt(const std::vector<char>& bytes, const std::string& path) {
  const std::map<std::string, Record> records = read_zip(bytes, path);

  // Every record under one top-level directory (torch::pickle_save: "archive"; torch.save: the
  // file's stem), and only the records keel and torch.save write: data.pkl, the storages'
  // data/<key>, and small records of text, each checked here and otherwise unused (the
  // storages' bytes are found through the zip directory, whatever .storage_alignment says).
  const std::string& first = records.begin()->first;
  const std::string prefix = first.substr(0, first.find('/') + 1);
  if (prefix.size() < 2) fail(path, "record " + shown(first) + " is not inside a directory");
  // The record's text, without one trailing newline.
  auto text = [&](const Record& rec) {
    std::string v(bytes.data() + rec.begin, rec.size);
    if (!v.empty() && v.back() == '\n') v.pop_back();
    return v;
  };
  auto digits = [](const std::string& v, size_t most) {
    return !v.empty() && v.size() <= most && v.find_first_not_of("0123456789") == std::string::npos;
  };
  std::set<std::string> data_keys;
  bool versioned = false;
  for (const auto& [name, rec] : records) {
    const std::string rest = name.compare(0, prefix.size(), prefix) == 0 ? name.substr(prefix.size()) : "";
    const std::string rec_name = "record " + shown(name);
    if (rest == "data.pkl") continue;
    if (rest == "version" || rest == ".data/version" || rest == ".format_version") {
      // The archive's format version (1.x and 2.x: "3"; PyTorchStreamWriter writes
      // .data/version instead from 6 on), and torch.save's own since 2.x (.format_version "1").
      const std::string v = text(rec);
      if (!digits(v, 2) || std::stoi(v) < 1 || std::stoi(v) > 10)
        fail(path, rec_name + " holds " + shown(v) + ", not a file format version from 1 to 10");
      versioned = versioned || rest != ".format_version";
      continue;
    }
    if (rest == "byteorder") {  // since 2.x: the byte order of the storages' bytes
      const std::string v = text(rec);
      if (v == "little") continue;
      if (v == "big")
        fail(path, rec_name + " says 'big': its tensors' bytes are big-endian, and keel reads "
                   "little-endian .pt files only");
      fail(path, rec_name + " holds " + shown(v) + ", not a byte order ('little')");
    }
    if (rest == ".storage_alignment") {  // since 2.x: the storages' alignment in the file
      if (!digits(text(rec), 8))
        fail(path, rec_name + " holds " + shown(text(rec)) + ", not a number of bytes");
      continue;
    }
    if (rest == ".data/serialization_id") {  // since 2.x: an id of the save, in decimal
      if (!digits(text(rec), 64))
        fail(path, rec_name + " holds " + shown(text(rec)) + ", not a serialization id (digits)");
      continue;
    }
    const std::string key = rest.rfind("data/", 0) == 0 ? rest.substr(5) : "";
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos)
      fail(path, rec_name + " is not one that keel or torch.save writes (" + prefix +
                     "data.pkl, " + prefix + "data/<number>, " + prefix + "version, " + prefix +
                     ".data/version, " + prefix + "byteorder, " + prefix + ".format_version, " +
                     prefix + ".storage_alignment, " + prefix + ".data/serialization_id)");
    data_keys.insert(key);
  }
  if (!versioned) fail(path, "no record " + shown(prefix + "version"));
  const auto pkl = records.find(prefix + "data.pkl");
  if (pkl == records.end()) fail(path, "no record " + shown(prefix + "data.pkl"));

  Unpickler u(bytes.data() + pkl->second.begin, pkl->second.size, path);
  const Ref root = u.run();
  if (root->kind != Node::kDict)
    fail(path, "data.pkl holds " + std::string(kind_name(*root)) + ", not a dict (a state dict)");

  // Each storage the pickle names is a record of exactly its bytes, and each data record is
  // one the pickle names.
  for (const auto& [key, s] : u.storages()) {
    const auto rec = records.find(prefix + "data/" + key);
    if (rec == records.end())
      fail(path, "data.pkl names storage " + shown(key) + ", but there is no record " +
                     shown(prefix + "data/" + key));
    uint64_t want = 0;
    const bool overflow = __builtin_mul_overflow(s->numel, element_size(s->dtype), &want);
    if (overflow || rec->second.size != want)
      fail(path, "record " + shown(prefix + "data/" + key) + " holds " +
                     std::to_string(rec->second.size) + " bytes, but its storage of " +
                     std::to_string(s->numel) + " " + c10::toString(s->dtype) + " elements needs " +
                     (overflow ? std::string("more") : std::to_string(want)));
    if (s->dtype == c10::ScalarType::Bool)
      for (uint64_t k = 0; k < want; ++k)
        if (static_cast<unsigned char>(bytes[rec->second.begin + k]) > 1)
          fail(path, "record " + shown(prefix + "data/" + key) + " holds a bool that is neither 0 nor 1");
    data_keys.erase(key);
  }
  if (!data_keys.empty())
    fail(path, "record " + shown(prefix + "data/" + *data_keys.begin()) +
                   " is not a storage data.pkl names");

  // The tensors, named by their keys from the root down joined with '.' (an int key in
  // decimal, a list's or tuple's item by its index: {"state": {0: {"exp_avg": t}}} names t
  // "state.0.exp_avg"), in the pickle's order; values that are not tensors are left out. A
  // tensor placed twice (tied weights) is named twice.
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  uint64_t visits = 0, name_bytes = 0;
  // Depth-first; recursion is bounded by kMaxDepth, which every value's depth is within.
  std::function<void(const Ref&, const std::string&)> walk = [&](const Ref& v,
                                                                 const std::string& name) {
    if (++visits > kMaxVisits)
      fail(path, "data.pkl: naming its tensors walks over " + std::to_string(kMaxVisits) +
                     " values (values placed in others many times over)");
    name_bytes += name.size();
    if (name_bytes > kMaxNameBytes)
      fail(path, "data.pkl: naming its tensors makes over " + std::to_string(kMaxNameBytes) +
                     " bytes of names (long keys placed in others many times over)");
    auto child = [&](const std::string& key) { return name.empty() ? key : name + "." + key; };
    if (v->kind == Node::kDict) {
      for (size_t k = 0; k < v->items.size(); k += 2)
        walk(v->items[k + 1], child(key_text(*v->items[k])));
    } else if (v->kind == Node::kList || v->kind == Node::kTuple) {
      for (size_t k = 0; k < v->items.size(); ++k) walk(v->items[k], child(std::to_string(k)));
    } else if (v->kind == Node::kTensor) {
      if (!names.insert(name).second)
        fail(path, "data.pkl names two tensors " + shown(name) +
                       " (nested keys are joined with '.': 'a.b' is also {'a': {'b': ...}})");
      TensorSpec t;
      t.name = name;
      t.dtype = v->dtype;
      t.sizes = v->sizes;
      t.strides = v->strides;
      t.storage_offset = v->offset;
      t.storage_numel = v->storage->numel;
      const Record& rec = records.at(prefix + "data/" + v->storage->s);
      t.data_begin = rec.begin;
      t.data_bytes = rec.size;
      out.push_back(std::move(t));
    }
  };
  walk(root, "");
  return out;
}

}  // namespace keel_torch_pt
