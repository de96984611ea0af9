"""Human-approval start gate for conduit."""
