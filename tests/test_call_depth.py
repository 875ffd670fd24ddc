"""tools/call_depth.py's parts that need no gdb: the names it probes come from the kernels' sources
(the functions forward()'s ops reach, the vector helpers of kernels/simd_math.h only on request),
and its listing keeps the chains that no longer chain extends. The gdb run itself is a measurement
(design.md#seam), not part of make test. Standard library only."""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import call_depth  # noqa: E402


class CallDepthNames(unittest.TestCase):
    def test_names_from_the_kernels(self):
        names = set(call_depth.kernel_function_names(vector_helpers=False))
        # a reference op and its kernel, the fast ops, a product kernel, inlined attention steps
        for name in ("matmul_reference", "rmsnorm_scalar", "attention_fast", "rows_qi_n1", "attend_queries",
                     "q8_scores_128", "scores_step", "quantize_rows", "lane_softmax"):
            self.assertIn(name, names)
        for not_a_function in ("if", "for", "while", "return", "sizeof"):
            self.assertNotIn(not_a_function, names)
        self.assertNotIn("fv_fma", names)  # simd_math.h's helpers only with vector_helpers
        self.assertIn("fv_fma", call_depth.kernel_function_names(vector_helpers=True))

    def test_listing_keeps_the_longest_chains(self):
        a = [["matmul", False], ["matmul_task", False]]
        b = a + [["rows_qi_n1", False], ["qi_dot", True]]
        c = [["matmul", False], ["start_product", False]]
        self.assertEqual(call_depth.maximal([a, b, c]), [b, c])
        self.assertEqual(call_depth.shown(b), "matmul > matmul_task > rows_qi_n1 > [qi_dot]")


if __name__ == "__main__":
    unittest.main()
