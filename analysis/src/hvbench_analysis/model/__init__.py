"""A performance model of a set of runs: each run's latency statistics (mean, SD, p50, p99,
p99.9, max) predicted from the settings that vary between the runs, with an interval, and
checked by holding out whole configurations.

Each statistic is modelled on its logarithm (latencies are positive and spread in proportion
to their size), in two parts:
- an analytical part (ANALYTIC): a line in log(1 + bound), bound the longest time the
  reservation can leave the job without CPU as read back (bounds.py: 2·(P − B)); or a queue's
  knee in the CPU reserved per record; or, where the runs hold a traced reference, a line in
  the log of the statistic the reservation simulator gives (simulated.py); or a constant;
- a learned part, a Gaussian process (Matérn) over every input that varies (rate, share of a
  CPU, CPU per record, period, extratime, weight, target, scheduler, neighbours), fitted to
  what the analytical part leaves, with the run-to-run spread modelled by setting (a second
  process: runs near a knee spread far more than runs away from it), so its interval is where
  a new run's statistic is expected: Gaussian processes state this from tens of runs, where
  quantile boosting would need hundreds. A knee's own uncertainty (where it lies) comes from
  refitting it on resampled runs (bootstrap_analytic).
Each statistic takes the form (FORMS) that predicted held-out configurations best
(choose_forms). docs/model.md says why.

    table = run_table(load_runs(dirs))       # one row per run: inputs and statistics
    model = fit(table)
    model.predict(rows)                      # median and 90 % interval per statistic
    forms, validation = choose_forms(table)  # each configuration held out in turn
"""

# the package's names, from the module that defines each
from hvbench_analysis.model.cli import (  # noqa: F401
    fit_folder,
    main,
)
from hvbench_analysis.model.fit import (  # noqa: F401
    ANALYTIC,
    BOOTSTRAP,
    FORMS,
    KNEES,
    NOISE_FLOOR,
    SIMULATED_FORMS,
    Fitted,
    Form,
    Kernels,
    Model,
    analytic_of,
    analytic_part,
    basis_of,
    bootstrap_analytic,
    curve_kernel,
    first_kernel,
    fit,
    fit_analytic,
    fit_process,
    fit_statistic,
    for_statistic,
    forms_for,
    knee,
    noise_kernel,
    process,
    spread_by_setting,
    with_derived,
)
from hvbench_analysis.model.saved import (  # noqa: F401
    FORMAT,
    MODEL_FILE,
    NUMERIC_COLUMNS,
    RUNS_FILE,
    VALIDATION_FILE,
    load,
    read_table,
    read_validation,
    save,
    saved_kernels,
    sklearn_version,
    theta_of,
)
from hvbench_analysis.model.simulated import (  # noqa: F401
    Simulator,
    with_simulation,
)
from hvbench_analysis.model.table import (  # noqa: F401
    CATEGORICAL,
    DEFAULTS,
    MEASUREMENT,
    NUMERIC,
    PERCENTILE_OF,
    SETTINGS,
    SIM,
    SIM_COLUMNS,
    STATISTICS,
    TRANSFORM,
    Inputs,
    ModelError,
    Z,
    bound_of,
    categorical_inputs,
    config_keys,
    cpu_share,
    lost_latency_ms,
    numeric_inputs,
    run_statistics,
    run_table,
)
from hvbench_analysis.model.validate import (  # noqa: F401
    MIN_HELD_OUT,
    VALIDATION_COLUMNS,
    choose_forms,
    fit_chosen,
    interval_scales,
    validate,
    validation_summary,
)
