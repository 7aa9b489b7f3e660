"""The order example: reserve, charge (effect), email (effect), ship."""
