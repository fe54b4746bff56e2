"""The published reference numbers (CSV files beside this one), shipped inside the helpers
package as ``helpers.published_data``; read them with ``helpers.published.load``."""
