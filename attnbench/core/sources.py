"""The papers and posts attnbench implements, cited by author, title, year and link.

A mechanism's record lists its :class:`Source` entries (``Mechanism.sources``); ``attnbench list``
shows them and ``attnbench list --format json`` gives every field. Code and docs cite a work by
its short form (``Su 2021``), which this catalogue resolves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Source:
    """One cited work. ``short`` is how code and tables refer to it: ``Zhai et al. 2021``."""

    short: str
    authors: str
    title: str
    year: int
    link: str
    note: str = ""  # what attnbench takes from it, when that is not the whole work

    def plain(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f'{self.authors}, "{self.title}", {self.year}, {self.link}'


def _kexue(number: int) -> str:
    return f"https://kexue.fm/archives/{number}"


# -- the attention mechanisms ----------------------------------------------------------------
VASWANI_2017 = Source("Vaswani et al. 2017", "Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, "
                      "Kaiser, Polosukhin", "Attention Is All You Need", 2017,
                      "https://arxiv.org/abs/1706.03762")  # fmt: skip
SU_2021_ENTROPY = Source(
    "Su 2021", "Su Jianlin",
    "Looking at attention's scale operation from entropy invariance (in Chinese)", 2021,
    _kexue(8823), "Attention-O and Attention-E (log_512 n scaling) and the extrapolation table",
)  # fmt: skip
CHIANG_CHOLAK_2022 = Source(
    "Chiang & Cholak 2022", "David Chiang, Peter Cholak",
    "Overcoming a Theoretical Limitation of Self-Attention (ACL 2022)", 2022,
    "https://arxiv.org/abs/2202.12172", "the natural-log scaling log(n)/sqrt(d)",
)  # fmt: skip
NAKANISHI_2025 = Source(
    "Nakanishi 2025", "Ken M. Nakanishi", "Scalable-Softmax Is Superior for Attention", 2025,
    "https://arxiv.org/abs/2501.19399", "SSMax: softmax(s log(n) z), s learned per head",
)  # fmt: skip
DAO_2022 = Source(
    "Dao et al. 2022", "Tri Dao, Daniel Y. Fu, Stefano Ermon, Atri Rudra, Christopher Ré",
    "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", 2022,
    "https://arxiv.org/abs/2205.14135",
)  # fmt: skip
DAO_2023 = Source(
    "Dao 2023", "Tri Dao",
    "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", 2023,
    "https://arxiv.org/abs/2307.08691", "multi-query and grouped-query attention in the kernel",
)  # fmt: skip
SHAZEER_2019 = Source(
    "Shazeer 2019", "Noam Shazeer", "Fast Transformer Decoding: One Write-Head is All You Need",
    2019, "https://arxiv.org/abs/1911.02150",
)  # fmt: skip
AINSLIE_2023 = Source(
    "Ainslie et al. 2023", "Joshua Ainslie, James Lee-Thorp, Michiel de Jong, Yury Zemlyanskiy, "
    "Federico Lebrón, Sumit Sanghai",
    "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", 2023,
    "https://arxiv.org/abs/2305.13245",
)  # fmt: skip
SU_2019_SPARSE = Source(
    "Su 2019", "Su Jianlin",
    "Born to save: from standard attention to sparse attention (in Chinese)", 2019, _kexue(6853),
    "atrous, local and OpenAI's sparse self-attention",
)  # fmt: skip
CHILD_2019 = Source(
    "Child et al. 2019", "Rewon Child, Scott Gray, Alec Radford, Ilya Sutskever",
    "Generating Long Sequences with Sparse Transformers", 2019, "https://arxiv.org/abs/1904.10509",
)  # fmt: skip
BELTAGY_2020 = Source(
    "Beltagy et al. 2020", "Iz Beltagy, Matthew E. Peters, Arman Cohan",
    "Longformer: The Long-Document Transformer", 2020, "https://arxiv.org/abs/2004.05150",
    "sliding-window attention",
)  # fmt: skip
ZAHEER_2020 = Source(
    "Zaheer et al. 2020", "Manzil Zaheer et al.", "Big Bird: Transformers for Longer Sequences",
    2020, "https://arxiv.org/abs/2007.14062",
)  # fmt: skip
DING_2023 = Source(
    "Ding et al. 2023", "Jiayu Ding et al.",
    "LongNet: Scaling Transformers to 1,000,000,000 Tokens", 2023,
    "https://arxiv.org/abs/2307.02486",
)  # fmt: skip
ZHAI_2021 = Source(
    "Zhai et al. 2021", "Shuangfei Zhai, Walter Talbott, Nitish Srivastava, Chen Huang, Hanlin "
    "Goh, Ruixiang Zhang, Josh Susskind", "An Attention Free Transformer", 2021,
    "https://arxiv.org/abs/2105.14103",
)  # fmt: skip
LABML_AFT = Source(
    "labml.ai AFT", "Varuna Jayasiri, Nipun Wijerathne (labml.ai)",
    "An Attention Free Transformer (annotated PyTorch implementation)", 2021,
    "https://nn.labml.ai/transformers/aft/index.html",
)  # fmt: skip
HUA_2022 = Source(
    "Hua et al. 2022", "Weizhe Hua, Zihang Dai, Hanxiao Liu, Quoc V. Le",
    "Transformer Quality in Linear Time (ICML 2022)", 2022, "https://arxiv.org/abs/2202.10447",
    "GAU, FLASH-Quad, FLASH and MC-TFM",
)  # fmt: skip
SU_2022_FLASH = Source(
    "Su 2022", "Su Jianlin",
    "FLASH: possibly the most interesting efficient Transformer design of late (in Chinese)", 2022,
    _kexue(8934), "the 1/(n s) normalisation of relu² and the causal normaliser of FLASH",
)  # fmt: skip
KATHAROPOULOS_2020 = Source(
    "Katharopoulos et al. 2020", "Angelos Katharopoulos, Apoorv Vyas, Nikolaos Pappas, "
    "François Fleuret",
    "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention", 2020,
    "https://arxiv.org/abs/2006.16236",
)  # fmt: skip
SUN_2023 = Source(
    "Sun et al. 2023", "Yutao Sun, Li Dong, Shaohan Huang, Shuming Ma, Yuqing Xia, Jilong Xue, "
    "Jianyong Wang, Furu Wei",
    "Retentive Network: A Successor to Transformer for Large Language Models", 2023,
    "https://arxiv.org/abs/2307.08621",
)  # fmt: skip

# -- positions and length extrapolation --------------------------------------------------------
SU_2021_ROFORMER = Source(
    "Su et al. 2021", "Jianlin Su, Yu Lu, Shengfeng Pan, Ahmed Murtadha, Bo Wen, Yunfeng Liu",
    "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021,
    "https://arxiv.org/abs/2104.09864",
)  # fmt: skip
CHEN_2023_PI = Source(
    "Chen et al. 2023", "Shouyuan Chen, Sherman Wong, Liangjian Chen, Yuandong Tian",
    "Extending Context Window of Large Language Models via Positional Interpolation", 2023,
    "https://arxiv.org/abs/2306.15595",
)  # fmt: skip
BLOC97_2023_NTK = Source(
    "bloc97 2023", "bloc97",
    "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+) context size without any "
    "fine-tuning and minimal perplexity degradation", 2023,
    "https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/",
)  # fmt: skip
PENG_2023_YARN = Source(
    "Peng et al. 2023", "Bowen Peng, Jeffrey Quesnelle, Honglu Fan, Enrico Shippole",
    "YaRN: Efficient Context Window Extension of Large Language Models", 2023,
    "https://arxiv.org/abs/2309.00071",
)  # fmt: skip
SU_2023_REROPE = Source(
    "Su 2023", "Su Jianlin",
    "The road to upgrading Transformers, part 12: ReRoPE, infinite extrapolation (in Chinese)",
    2023, _kexue(9708),
)  # fmt: skip

# -- kernels --------------------------------------------------------------------------------------
DONG_2024_FLEX = Source(
    "Dong et al. 2024", "Juechu Dong, Boyuan Feng, Driss Guessous, Yanbo Liang, Horace He",
    "Flex Attention: A Programming Model for Generating Optimized Attention Kernels", 2024,
    "https://arxiv.org/abs/2412.05496", "the FlexAttention API behind the ``flex`` paths",
)  # fmt: skip

# -- regressions over time (attnbench history) -----------------------------------------------------
KILLICK_2012_PELT = Source(
    "Killick et al. 2012", "Rebecca Killick, Paul Fearnhead, Idris A. Eckley",
    "Optimal detection of changepoints with a linear computational cost (Journal of the American "
    "Statistical Association 107(500):1590-1598)", 2012,
    "https://doi.org/10.1080/01621459.2012.737745",
    "PELT, the change-point search of attnbench history steps",
)  # fmt: skip
JACKSON_2005_OP = Source(
    "Jackson et al. 2005", "Brad Jackson, Jeffrey D. Scargle, David Barnes, Sundararajan "
    "Arabhi, Alina Alt, Peter Gioumousis, Elyus Gwin, Paungkaew Sangtrakulcharoen, Linda Tan, "
    "Tun Tao Tsai", "An algorithm for optimal partitioning of data on an interval (IEEE Signal "
    "Processing Letters 12(2):105-108)", 2005, "https://arxiv.org/abs/math/0309285",
    "optimal partitioning, which PELT prunes",
)  # fmt: skip
ZHANG_SIEGMUND_2007 = Source(
    "Zhang & Siegmund 2007", "Nancy R. Zhang, David O. Siegmund",
    "A modified Bayes information criterion with applications to the analysis of comparative "
    "genomic hybridization data (Biometrics 63(1):22-32)", 2007,
    "https://doi.org/10.1111/j.1541-0420.2006.00662.x",
    "the penalty of one more change point, 3 ln n",
)  # fmt: skip
