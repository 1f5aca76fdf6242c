"""Stream ids of the keyed generator (csrc/include/tokensampler/rng.h, enum RngStream)."""

GUMBEL_STREAM = 0        # per-token Gumbel noise for sampling
ACCEPT_COIN_STREAM = 1   # rejection-sampling acceptance coin
RESIDUAL_STREAM = 2      # Gumbel noise for the rejection residual
