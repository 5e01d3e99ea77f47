// Replays op calls recorded on x86-64 (the generic build) against this build's ops; prints per-op errors.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

static std::string dir;

static at::ScalarType dtype_of(const std::string& s) {
  if (s == "f32") return at::kFloat;
  if (s == "i64") return at::kLong;
  if (s == "i32") return at::kInt;
  if (s == "u8") return at::kByte;
  if (s == "i8") return at::kChar;
  if (s == "b8") return at::kBool;
  if (s == "f16") return at::kHalf;
  throw std::runtime_error("dtype " + s);
}

static at::Tensor read_tensor(std::istringstream& in) {
  std::string dt, file;
  int nd;
  in >> dt >> nd;
  std::vector<int64_t> shape(nd);
  for (auto& d : shape) in >> d;
  in >> file;
  auto t = at::empty(shape, at::TensorOptions().dtype(dtype_of(dt)));
  std::ifstream f(dir + "/" + file, std::ios::binary);
  f.read(reinterpret_cast<char*>(t.data_ptr()), t.nbytes());
  return t;
}

static c10::IValue read_value(std::ifstream& m) {
  std::string line;
  std::getline(m, line);
  std::istringstream in(line);
  std::string kind;
  in >> kind;
  if (kind == "N") return c10::IValue();
  if (kind == "T") return read_tensor(in);
  if (kind == "I") { int64_t v; in >> v; return v; }
  if (kind == "F") { double v; in >> v; return v; }
  if (kind == "B") { int v; in >> v; return bool(v); }
  if (kind == "L") {
    int n; in >> n;
    c10::List<at::Tensor> list;
    for (int i = 0; i < n; ++i) list.push_back(read_value(m).toTensor());
    return list;
  }
  throw std::runtime_error("value " + line);
}

struct Stat { double worst = 0; int64_t mismatched = 0, calls = 0, nan_mismatch = 0; };

static void compare(const at::Tensor& got, const at::Tensor& want, Stat& s) {
  if (!got.sizes().equals(want.sizes())) { s.mismatched += want.numel() + 1; return; }
  if (want.is_floating_point()) {
    auto g = got.to(at::kDouble), w = want.to(at::kDouble);
    s.nan_mismatch += (g.isnan() != w.isnan()).sum().item<int64_t>();
    auto finite = w.isfinite() & g.isfinite();
    if (finite.any().item<bool>()) {
      double scale = std::max(w.masked_select(finite).abs().max().item<double>(), 1e-30);
      double err = (g - w).masked_select(finite).abs().max().item<double>() / scale;
      s.worst = std::max(s.worst, err);
    }
    s.mismatched += ((g.isinf() | w.isinf()) & (g != w)).sum().item<int64_t>();
  } else {
    s.mismatched += (got != want).sum().item<int64_t>();
  }
}

int main(int argc, char** argv) {
  dir = argv[1];
  std::string ns = argc > 2 ? argv[2] : "metronome";
  std::ifstream m(dir + "/manifest.txt");
  std::map<std::string, Stat> stats;
  std::string line;
  while (std::getline(m, line)) {
    std::istringstream in(line);
    std::string tag, name;
    int nargs;
    in >> tag >> name >> nargs;
    if (tag != "CALL") throw std::runtime_error("expected CALL: " + line);
    torch::jit::Stack stack;
    for (int i = 0; i < nargs; ++i) stack.push_back(read_value(m));
    auto args = stack;  // the tensors the op may write into (same storage)
    std::getline(m, line);
    int nout = std::stoi(line.substr(4));
    std::vector<c10::IValue> want;
    for (int i = 0; i < nout; ++i) want.push_back(read_value(m));
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow((ns + "::" + name).c_str(), "");
    op.callBoxed(&stack);
    Stat& s = stats[name];
    s.calls++;
    for (int i = 0; i < nout; ++i) compare(stack[i].toTensor(), want[i].toTensor(), s);
    std::getline(m, line);
    int nmut = std::stoi(line.substr(4));
    for (int j = 0; j < nmut; ++j) {
      std::getline(m, line);
      int i = std::stoi(line.substr(4));
      compare(args[i].toTensor(), read_value(m).toTensor(), s);
    }
  }
  bool ok = true;
  for (auto& [name, s] : stats) {
    bool good = s.worst < 1e-4 && s.mismatched == 0 && s.nan_mismatch == 0;
    ok &= good;
    std::cout << name << ": " << s.calls << " calls, worst relative error " << s.worst << ", mismatched "
              << s.mismatched << ", NaN placement mismatched " << s.nan_mismatch << (good ? "  ok" : "  FAIL") << "\n";
  }
  std::cout << (ok ? "all ops agree with the x86-64 generic build" : "SOME OPS DISAGREE") << "\n";
  return ok ? 0 : 1;
}
