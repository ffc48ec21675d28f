"""Monte Carlo sweeps: thousands to millions of randomised vehicles fly a mission.

``quadjax sweep`` is the command line; :func:`run_sweep` the library entry point::

    from quadjax import sweep
    cfg = sweep.config.from_dict({"vehicles": 1024, "mission": {"duration": 10.0}})
    result = sweep.run_sweep(cfg, "results/my_sweep")
    print(sweep.format_table(result.summary))
"""

from quadjax.sweep import config
from quadjax.sweep.config import SweepConfig, from_dict, load
from quadjax.sweep.gusts import Gusts, gust_init, gust_step
from quadjax.sweep.randomise import (
    InitialSpread, Perturbation, RandomSpec, SensorNoise, initial_state, observe, raw_draws, sample_params,
    sample_valid_params, small_rotation, standard_normal,
)
from quadjax.sweep.runner import SweepResult, prepare, run_chunk, run_sweep
from quadjax.sweep.stats import CRASH_IDS, ErrorHistogram, exact_quantiles, format_table, summarise

__all__ = [
    "CRASH_IDS", "ErrorHistogram", "Gusts", "InitialSpread", "Perturbation", "RandomSpec", "SensorNoise",
    "SweepConfig", "SweepResult", "config", "exact_quantiles", "format_table", "from_dict", "gust_init",
    "gust_step", "initial_state", "load", "observe", "prepare", "raw_draws", "run_chunk", "run_sweep",
    "sample_params", "sample_valid_params", "small_rotation", "standard_normal", "summarise",
]
