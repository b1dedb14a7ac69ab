"""Provisioning advisor: what to rent (types, counts, spot or on-demand) under a budget or a
deadline. DeepVM (one GPU type, exact), mixed types (MILP), spotDNN (SLO provisioning), a
revocation model, and pools for the liveput runtime chosen by simulation."""

from liveput.advise.deepvm import (
    NETWORK_BOUNDS,
    DeepVMConfig,
    advise_deepvm,
    enumerate_deepvm,
    saturation_point,
)
from liveput.advise.mixed import MixedConfig, advise_mixed
from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.revocation import REVOCATION_MODELS, RevocationModel, RevocationOverhead
from liveput.advise.scaling import PUBLISHED_FITS, LogisticScaling, fit_logistic, scaling_for
from liveput.advise.slo import SLOConfig, SLOProblem, advise_slo, problem_from_catalog
from liveput.catalog import BUILTIN_CATALOGS, Catalog, InstanceSpec, Market, load_catalog

__all__ = [
    "BUILTIN_CATALOGS",
    "REVOCATION_MODELS",
    "PUBLISHED_FITS",
    "Advice",
    "Catalog",
    "DeepVMConfig",
    "InstanceCount",
    "InstanceSpec",
    "LogisticScaling",
    "Market",
    "MixedConfig",
    "Plan",
    "RevocationModel",
    "RevocationOverhead",
    "SLOConfig",
    "SLOProblem",
    "NETWORK_BOUNDS",
    "advise_deepvm",
    "advise_mixed",
    "advise_slo",
    "enumerate_deepvm",
    "saturation_point",
    "fit_logistic",
    "load_catalog",
    "problem_from_catalog",
    "scaling_for",
]
