"""Quaternion helpers in component form against their defining products."""

import numpy as np

from quadjax.quaternion import quat_kinematics_c, quat_multiply_c


def test_kinematics_is_half_the_product_with_the_pure_rate_quaternion():
    """q̇ = ½ q ⊗ (0, ω), written out without the zero terms, equals the Hamilton product."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, w = rng.normal(size=4), rng.normal(size=3) * 10
        want = 0.5 * np.asarray(quat_multiply_c(tuple(q), (0.0, *w)))
        np.testing.assert_allclose(quat_kinematics_c(tuple(q), tuple(w)), want, rtol=1e-14, atol=1e-14)
