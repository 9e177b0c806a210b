from .config_scope import installed_config_dir, is_config_scope_registered, register_config_scope
from .runtime import (
    adapt_cfg_to_device,
    allow_trusted_checkpoint_loading,
    apply_common_args,
    init_distributed_if_cpu,
    shutdown_distributed,
)

__all__ = [
    'allow_trusted_checkpoint_loading', 'apply_common_args', 'adapt_cfg_to_device',
    'init_distributed_if_cpu', 'shutdown_distributed', 'installed_config_dir',
    'is_config_scope_registered', 'register_config_scope'
]
