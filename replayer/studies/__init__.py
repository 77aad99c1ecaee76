"""Many runs judged together: sweeps over a load level and the capacity search.
See docs/capacity.md."""
