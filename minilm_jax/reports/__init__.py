"""What programs print and draw: plain-text tables of result rows (`tables`) and figures (`plots`)."""
