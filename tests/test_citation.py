"""The repository says who may use it and how to cite it, consistently: LICENSE, CITATION.cff,
pyproject.toml and the docs' references agree, and the README and the docs point at nothing
outside the repository except the optional offline data folder."""

import json
import re
import tomllib
from pathlib import Path

import yaml

import nodelm_lib as nl

REPO = Path(__file__).resolve().parents[1]


def pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_license_file_is_the_licence_pyproject_declares():
    assert pyproject()["license"] == "MIT"
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "the nodelm authors" in text


def test_citation_cff_matches_the_package():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors", "type", "license", "version"):
        assert cff.get(key), key
    assert str(cff["version"]) == pyproject()["version"] == nl.__version__
    assert cff["license"] == pyproject()["license"]
    titles = [ref["title"] for ref in cff["references"]]
    assert "Neural ODE Transformers: Analyzing Internal Dynamics and Adaptive Fine-tuning" in titles
    for ref in cff["references"]:
        assert ref["authors"] and ref["year"] and ref["type"], ref["title"]


def references_bibtex():
    """The BibTeX of docs/references.md (the README links it)."""
    references = (REPO / "docs" / "references.md").read_text()
    return "\n".join(re.findall(r"```bibtex\n(.*?)```", references, re.S))


def test_references_bibtex_entries_are_well_formed_and_cover_the_cited_work():
    assert "docs/references.md" in (REPO / "README.md").read_text()
    bib = references_bibtex()
    keys = re.findall(r"@\w+\{([^,\s]+),", bib)
    assert len(keys) == len(set(keys)), keys
    assert bib.count("{") == bib.count("}")
    for key in ("tong2025neural", "chen2018neural", "kidger2021efficient", "gu2023mamba", "daulbaev2020interpolation"):
        assert key in keys


def markdown_cells():
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                yield path.name, "".join(cell["source"])


def test_docs_point_inside_the_repository_except_the_offline_data_folder():
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        assert "shared/seeds" not in text and "seed documents" not in text, page
        for match in re.finditer(r"\.\./shared/[\w./-]*", text):
            assert re.fullmatch(r"\.\./shared/data(/[\w./-]*)?", match.group(0)), (page, match.group(0))
    for name, text in markdown_cells():
        assert "../shared" not in text and "shared/seeds" not in text and "seed documents" not in text, name
