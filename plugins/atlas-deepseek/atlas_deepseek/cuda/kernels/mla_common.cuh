// atlas-deepseek: constants shared by the MLA kernels (mla.cu, mla_attention.cu).
#pragma once

// Widest latent the register-held kernels take (MLA_MAX_RANK / 32 values a lane).
#define MLA_MAX_RANK 1024
// Warps of the per-(token, head) attention kernels, each an online softmax over every
// MLA_WARPS-th key, merged through shared memory.
#define MLA_WARPS 4
