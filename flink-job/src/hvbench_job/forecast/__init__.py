"""Flow forecasting: windows of 12 five-minute flows → the next flow."""

LOOKBACK = 12  # one hour of five-minute flows
