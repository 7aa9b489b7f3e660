"""The trip example: book a flight, charge the card, book a hotel; a sold-out hotel rolls it all back."""
