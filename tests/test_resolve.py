"""Model resolution: local directories, HF cache layouts, and the error when nothing is found."""

import pytest

from atlas_core.weights import resolve as resolve_mod
from atlas_core.weights import ModelNotFoundError, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def fail(*args, **kwargs):
        raise OSError("network disabled in tests")
    monkeypatch.setattr(resolve_mod, "_download", fail)


def _fake_cache(root, repo="org/tiny", commit=COMMIT, ref="main"):
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit + "\n")
    return snapshot


def test_local_directory(tmp_path):
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model(str(tmp_path)) == tmp_path


def test_local_path_that_is_not_a_directory(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ModelNotFoundError, match="is not a model directory"):
        resolve_model(tmp_path / "f.txt")
    with pytest.raises(ModelNotFoundError, match="is not a model directory"):
        resolve_model("./does/not/exist")


def test_cache_dir_argument(tmp_path):
    snapshot = _fake_cache(tmp_path / "c")
    assert resolve_model("org/tiny", cache_dir=tmp_path / "c") == snapshot


@pytest.mark.parametrize("var,sub", [("HF_HUB_CACHE", ""), ("HF_HOME", "hub")])
def test_env_caches(tmp_path, monkeypatch, var, sub):
    root = tmp_path / "env"
    snapshot = _fake_cache(root / sub if sub else root)
    monkeypatch.setenv(var, str(root))
    assert resolve_model("org/tiny") == snapshot


def test_default_cache_under_xdg(tmp_path):
    snapshot = _fake_cache(tmp_path / "xdg" / "huggingface" / "hub")
    assert resolve_model("org/tiny") == snapshot


def test_revision_ref_and_commit(tmp_path):
    other = "f" * 40
    _fake_cache(tmp_path, commit=COMMIT)
    snapshot_b = _fake_cache(tmp_path, commit=other, ref="v2")
    assert resolve_model("org/tiny", cache_dir=tmp_path, revision="v2") == snapshot_b
    assert resolve_model("org/tiny", cache_dir=tmp_path, revision=other) == snapshot_b
    assert resolve_model("org/tiny", cache_dir=tmp_path).name == COMMIT


def test_incomplete_snapshot_is_skipped(tmp_path):
    snapshot = _fake_cache(tmp_path)
    (snapshot / "config.json").unlink()
    with pytest.raises(ModelNotFoundError):
        resolve_model("org/tiny", cache_dir=tmp_path)


def test_not_found_lists_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("org/absent")
    msg = str(info.value)
    assert "'org/absent'" in msg and str(tmp_path / "home" / "hub") in msg
    assert "network disabled in tests" in msg
    assert "HF_HOME" in msg and "--cache-dir" in msg and "local directory" in msg


def test_offline_skips_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE is set"):
        resolve_model("org/absent", cache_dir=tmp_path)


def test_download_is_used_when_not_cached(tmp_path, monkeypatch):
    calls = []

    def fake(repo_id, cache_dir, revision):
        calls.append((repo_id, cache_dir, revision))
        return tmp_path
    monkeypatch.setattr(resolve_mod, "_download", fake)
    assert resolve_model("org/new", cache_dir=tmp_path, revision="r") == tmp_path
    assert calls == [("org/new", tmp_path, "r")]
