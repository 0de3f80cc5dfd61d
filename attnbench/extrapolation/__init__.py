"""The length-extrapolation experiment: an MLM trained at a short length, evaluated at longer
ones (config -> model -> train -> evaluate -> report; entropy, the scaling argument checked)."""
