import numpy as np
import tpuhal

with tpuhal.open("sim:0") as dev:                       # the simulated BM1684X-class card
    a = tpuhal.Tensor(dev.upload(np.random.rand(64, 128).astype(np.float32)))
    b = tpuhal.Tensor(dev.upload(np.random.rand(128, 32).astype(np.float32)))
    y = dev.tensor((64, 32), "f32")                     # device memory
    dev.queue("compute").run(tpuhal.ops.matmul(a, b, y)).submit().wait(timeout=10)
    print(dev.properties.board, np.allclose(y.download(), a.download() @ b.download(), rtol=1e-5))
