"""Devices of one group that call collectives over different axes are a mismatch, not a deadlock."""
import numpy as np
import pytest

import spmdsim
from spmdsim import lax

HERE = __file__.rsplit("/", 1)[-1]


@pytest.mark.parametrize("repeat", range(3))  # whichever lane gets there first
def test_one_lane_calling_psum_over_j_where_the_others_use_i_is_a_mismatch(repeat):
    def lane(x):
        if lax.axis_index("i") == 1 and lax.axis_index("j") == 0:
            return lax.psum(x, "j")     # its 'j' partner, device 1 [i=1, j=1], calls psum over 'i'
        return lax.psum(x, "i")

    f = spmdsim.pmap(spmdsim.vmap(lane, axis_name="j"), axis_name="i")
    with pytest.raises(spmdsim.CollectiveMismatchError) as info:
        f(np.zeros((4, 2)))
    msg = str(info.value)
    assert msg.startswith("devices called different collectives at step 0 of psum over 'j' (the 1st collective")
    assert f"device 1 [i=1, j=0]: psum(float64[], axis_name='j') at tests/{HERE}:" in msg
    assert f"device 1 [i=1, j=1]: psum(float64[], axis_name='i') at tests/{HERE}:" in msg
