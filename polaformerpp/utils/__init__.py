from .checkpoint import (
    CheckpointMismatchError,
    LoadReport,
    StrictLoadHook,
    UnsafeCheckpointError,
    compare_state_dict,
    load_checkpoint_file,
    load_model_weights,
    register_safe_globals,
    set_unsafe_loading,
)
from .config_scope import installed_config_dir, is_config_scope_registered, register_config_scope
from .faults import RunStoppedError, run_tool_main
from .runtime import (
    DEFAULT_DIST_TIMEOUT,
    adapt_cfg_to_device,
    apply_common_args,
    apply_dist_timeout,
    dist_timeout,
    exit_after_distributed_run,
    freeze_long_lived_objects,
    init_distributed_if_cpu,
    shutdown_distributed,
)

__all__ = [
    'apply_common_args', 'adapt_cfg_to_device', 'exit_after_distributed_run', 'freeze_long_lived_objects',
    'init_distributed_if_cpu',
    'shutdown_distributed', 'DEFAULT_DIST_TIMEOUT', 'apply_dist_timeout', 'dist_timeout', 'RunStoppedError',
    'run_tool_main',
    'installed_config_dir', 'is_config_scope_registered', 'register_config_scope', 'CheckpointMismatchError',
    'LoadReport', 'StrictLoadHook', 'UnsafeCheckpointError', 'compare_state_dict', 'load_checkpoint_file',
    'load_model_weights', 'register_safe_globals', 'set_unsafe_loading'
]
