"""A run's length, device-hours, cost, energy and carbon, from one iteration.

A run of ``steps`` optimizer steps at ``iteration_time_s`` each takes

    time = steps × iteration time

(failure-free; ``sim.cost.goodput`` adds failures and checkpoints). Whoever rents or owns the
cluster pays for all of its devices for that time, those the plan leaves idle too:

    GPU-hours = devices × time / 3600,      cost = GPU-hours × price per GPU-hour.

Energy. A device draws its idle power plus a share of the rest that grows with how busy it
is; we take that share as linear in its busy fraction (the busy time of its compute stream
over the iteration time, ``DeviceSummary.busy_s / iteration_time_s``):

    P_device = idle + (full − idle) × busy share

This linear model is an assumption, not a measured curve: real boards draw less than their
TDP on memory-bound kernels and more than idle while waiting on communication. ``full`` is
the datasheet board power (TDP); without an idle figure a device is counted at ``full`` the
whole time, an upper bound. Each server's host (CPUs, memory, NICs, fans) adds its own power,
and the facility's power usage effectiveness (PUE: facility power over IT power, The Green
Grid's definition) scales the sum:

    E = (Σ_devices P_device + servers × P_host) × time × PUE,      carbon = E × grid intensity.
"""

from __future__ import annotations

__all__ = ["carbon_kg", "cluster_power_w", "cost", "energy_kwh", "gpu_hours", "time_to_train_s"]

J_PER_KWH = 3.6e6
"""Joules in a kilowatt-hour."""


def time_to_train_s(steps: int, iteration_time_s: float) -> float:
    """Failure-free wall time of ``steps`` iterations, seconds."""
    return steps * iteration_time_s


def gpu_hours(devices: int, time_s: float) -> float:
    """Device-hours of ``devices`` held for ``time_s`` seconds."""
    return devices * time_s / 3600.0


def cost(gpu_hours_total: float, price_per_gpu_hour: float | None) -> float | None:
    """``gpu_hours × price``; None without a price."""
    return None if price_per_gpu_hour is None else gpu_hours_total * price_per_gpu_hour


def cluster_power_w(*, devices: int, busy_device_share_sum: float, power_w: float, idle_power_w: float | None,
                    servers: int, host_power_w: float) -> float:
    """IT power of the cluster, watts: every device at idle plus (full − idle) × its busy share,
    and every server's host. ``busy_device_share_sum`` is Σ over the cluster's devices of their
    busy fraction (devices the plan does not use contribute 0). Without ``idle_power_w`` every
    device is counted at ``power_w``."""
    if idle_power_w is None:
        device_w = devices * power_w
    else:
        device_w = devices * idle_power_w + (power_w - idle_power_w) * busy_device_share_sum
    return device_w + servers * host_power_w


def energy_kwh(it_power_w: float, time_s: float, pue: float) -> float:
    """Facility energy of ``it_power_w`` drawn for ``time_s`` in a data centre of ``pue``, kWh."""
    return it_power_w * time_s * pue / J_PER_KWH


def carbon_kg(energy: float | None, g_per_kwh: float | None) -> float | None:
    """kg CO2e of ``energy`` kWh at a grid intensity of ``g_per_kwh``; None without either."""
    return None if energy is None or g_per_kwh is None else energy * g_per_kwh / 1000.0
