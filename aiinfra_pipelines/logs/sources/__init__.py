"""Real fleet recordings: source profiles (resources/sources) and the decoders behind them."""

from aiinfra_pipelines.logs.sources.profiles import (
    RoleSpec,
    SourceProfile,
    load_profiles,
    match_profile,
)

__all__ = ["RoleSpec", "SourceProfile", "load_profiles", "match_profile"]
