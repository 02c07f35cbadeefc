// Runs compiled Fashion-MNIST models over the test set and prints accuracy,
// agreement with the first model (fp32) and images per second.
//
//   fashion_mnist_eval --device sim:0 --images test_images.npy --labels test_labels.npy \
//       model_fp32.tpm model_fp16.tpm model_bf16.tpm model_int8.tpm
//
// Images are float32 [N, 1, 28, 28] normalised as in training; labels
// float32 [N] (class numbers). Each model's batch is its compiled input's
// first dimension; a last partial batch is padded and its padding ignored.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tpuhal/rt/compile.hpp"
#include "tpuhal/rt/model.hpp"

int main(int argc, char** argv) {
  std::string device = "sim:0", images_path, labels_path;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--device" || a == "--images" || a == "--labels") && i + 1 < argc) {
      (a == "--device" ? device : a == "--images" ? images_path : labels_path) = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::puts("usage: fashion_mnist_eval [--device URI] --images X.npy --labels Y.npy MODEL.tpm...");
      return 0;
    } else {
      models.push_back(a);
    }
  }
  if (images_path.empty() || labels_path.empty() || models.empty()) {
    std::fputs("fashion_mnist_eval: give --images, --labels and at least one model (--help)\n", stderr);
    return 2;
  }
  try {
    const tpuhal::rt::NdArray images = tpuhal::rt::read_npy(images_path);
    const tpuhal::rt::NdArray labels = tpuhal::rt::read_npy(labels_path);
    const std::size_t n = labels.values.size();
    const std::size_t per_image = images.values.size() / n;
    auto dev = tpuhal::open(device);
    std::vector<int> reference;
    std::printf("%-28s %9s %10s %12s\n", "model", "accuracy", "agreement", "images/s");
    for (const auto& path : models) {
      auto model = tpuhal::rt::Model::load(dev, path);
      auto inst = model.instance();
      const auto batch = static_cast<std::size_t>(model.inputs()[0].shape[0]);
      const std::size_t classes = model.outputs()[0].elements() / batch;
      std::vector<float> x(model.inputs()[0].elements()), y(model.outputs()[0].elements());
      std::vector<int> predicted(n);
      const auto start = std::chrono::steady_clock::now();
      for (std::size_t first = 0; first < n; first += batch) {
        const std::size_t count = std::min(batch, n - first);
        std::fill(x.begin(), x.end(), 0.0f);
        std::memcpy(x.data(), images.values.data() + first * per_image, count * per_image * sizeof(float));
        inst.run({tpuhal::rt::host(x)}, {tpuhal::rt::host(y)});
        for (std::size_t i = 0; i < count; ++i) {
          const float* row = y.data() + i * classes;
          predicted[first + i] = static_cast<int>(std::max_element(row, row + classes) - row);
        }
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::size_t correct = 0, agree = 0;
      for (std::size_t i = 0; i < n; ++i) {
        correct += predicted[i] == static_cast<int>(labels.values[i]);
        agree += reference.empty() || predicted[i] == reference[i];
      }
      if (reference.empty()) reference = predicted;
      std::printf(
          "%-28s %8.2f%% %9.2f%% %12.0f\n",
          (path.substr(path.find_last_of('/') + 1) + " (" + tpuhal::rt::to_string(model.precision()) + ")").c_str(),
          100.0 * correct / n, 100.0 * agree / n, n / seconds);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
