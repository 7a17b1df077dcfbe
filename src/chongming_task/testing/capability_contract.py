"""``CapabilityContract``: every section of the store contract beyond the core, one per
role (``chongming_task.stores.roles``) and one for the traits. ``StoreContract`` holds
them all; a section's tests run only where the store declares its role whole."""

from __future__ import annotations

from .batched_writes_contract import BatchedWritesContract
from .command_channel_contract import CommandChannelContract
from .fleet_registry_contract import FleetRegistryContract
from .maintenance_contract import MaintenanceContract
from .traits_contract import TraitsContract

__all__ = [
    "BatchedWritesContract",
    "CapabilityContract",
    "CommandChannelContract",
    "FleetRegistryContract",
    "MaintenanceContract",
    "TraitsContract",
]


class CapabilityContract(
    BatchedWritesContract,
    CommandChannelContract,
    FleetRegistryContract,
    MaintenanceContract,
    TraitsContract,
):
    """The four roles' sections and the traits'."""
