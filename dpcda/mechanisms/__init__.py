"""Beam-free mechanism cores: what each mechanism samples, which DP events it spends, its noise draws."""
