"""inference.worker.engine_factory fills the engine's and the kernels' configuration from settings."""

from inference.engine import cpu_matmul
from inference.worker.engine_factory import engine_runtime_configure
from kernels import config as kernels_config


def test_settings_reach_the_kernels_and_the_cpu_matmuls(settings, tmp_path, kernel_config, cpu_matmul_config):
    settings.KERNELS_BACKEND = "ref"
    settings.KERNELS_CPU_NATIVE = False
    settings.KERNELS_CACHE_DIR = str(tmp_path)
    settings.KERNELS_CC = "gcc -O1"
    settings.KERNELS_TUNE_MALLOC = False
    settings.ENGINE_CPU_UPCAST_MATMUL = "1"
    settings.ENGINE_CPU_PREPACK = False
    engine_runtime_configure()
    assert kernels_config.current() == kernels_config.KernelConfig(
        backend="ref", cpu_native=False, cache_dir=tmp_path, cc="gcc -O1", tune_malloc=False)
    assert cpu_matmul.configure() == ("1", False)


def test_unset_settings_keep_the_defaults(settings, kernel_config, cpu_matmul_config):
    for name in ("KERNELS_BACKEND", "KERNELS_CPU_NATIVE", "KERNELS_CACHE_DIR", "KERNELS_CC", "KERNELS_TUNE_MALLOC",
                 "ENGINE_CPU_UPCAST_MATMUL", "ENGINE_CPU_PREPACK"):
        setattr(settings, name, None)
    engine_runtime_configure()
    assert kernels_config.current() == kernels_config.KernelConfig()
    assert cpu_matmul.configure() == ("auto", True)
