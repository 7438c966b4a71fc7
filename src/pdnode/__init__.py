"""pdnode: plan, deploy and verify an SGLang prefill/decode-disaggregated node."""
