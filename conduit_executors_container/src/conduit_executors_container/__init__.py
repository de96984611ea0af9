"""Docker container executor for conduit (docker SDK)."""
