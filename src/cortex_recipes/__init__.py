"""cortex-recipes: release-qualified post-training journeys for Cortex Training."""

__version__ = "0.1.0"
