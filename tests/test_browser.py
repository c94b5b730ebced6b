"""The path a Prefect + MLflow user takes, in a real headless Chromium (Debian's chromium and
chromium-driver, driven by selenium): `infra/server.sh start` (what `make server` runs), open the Prefect
UI, find the train/tiny deployment, start a run from its form with parameters changed, wait until the UI
shows it Completed, take a screenshot; then find that run's metrics and registered agents in the MLflow UI,
and open one held-out episode as a trace. That screenshot (docs/images/mlflow-trace.png, checked by eye
once) shows the span tree on the left, the episode, solver (turn 0), executor (turn 1) with its `python`
tool span, verifier (turn 2), each turn with one assessment (the coach's feedback), and the executor's
prompt tail and response on the right.

Skipped when Chromium is not installed (`make browser` installs it), unless TEAMRL_REQUIRE_BROWSER=1
(CI), which turns the skip into a failure."""

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from infra.engines.zero import free_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.slow
if not (CHROMIUM and DRIVER):
    if os.environ.get("TEAMRL_REQUIRE_BROWSER") == "1":
        pytest.fail(
            "TEAMRL_REQUIRE_BROWSER=1 but chromium / chromedriver are not installed (make browser)", pytrace=False
        )
    pytest.skip("chromium and chromium-driver are not installed (make browser)", allow_module_level=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Prefect server + work pool + deployments + worker + MLflow UI, on free ports, state in a temp dir."""
    state, runs = tmp_path_factory.mktemp("server"), tmp_path_factory.mktemp("runs")
    env = os.environ | {
        "SERVER_STATE": str(state),
        "RUNS": str(runs),
        "PREFECT_PORT": str(free_port()),
        "MLFLOW_PORT": str(free_port()),
    }
    env.pop("PREFECT_API_URL", None)
    script = str(ROOT / "infra" / "server.sh")
    try:
        subprocess.run([script, "start"], env=env, check=True, timeout=600)
        yield {
            "prefect": f"http://127.0.0.1:{env['PREFECT_PORT']}",
            "mlflow": f"http://127.0.0.1:{env['MLFLOW_PORT']}",
            "runs": runs,
            "state": state,
        }
    finally:
        subprocess.run([script, "stop"], env=env, timeout=120)
    for name in ("prefect-server", "prefect-worker", "mlflow-ui"):
        assert not (state / f"{name}.pid").exists()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def _wait(predicate, timeout: float, what: str, every: float = 1.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if out := predicate():
            return out
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _field(driver, label: str):
    """The input of the schema-form property labelled `label` (e.g. 'Iterations (Optional)')."""
    from selenium.webdriver.common.by import By

    return driver.find_element(
        By.XPATH,
        f"//span[@class='schema-form-property__label' and normalize-space()="
        f"'{label}']/ancestor::div[contains(concat(' ', @class, ' '), ' schema-form-property ')][1]"
        "//*[self::input or self::textarea]",
    )


def _deployment_id(api: str, name: str) -> str:
    """The id of deployment `flow/deployment`, from the Prefect server's REST API."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{api}/api/deployments/name/{name}", timeout=30) as resp:
        return json.load(resp)["id"]


def _flow_runs_of(api: str, deployment_id: str) -> set[str]:
    """Ids of the deployment's flow runs, from the Prefect server's REST API."""
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{api}/api/flow_runs/filter",
        data=json.dumps({"deployments": {"id": {"any_": [deployment_id]}}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return {run["id"] for run in json.load(resp)}


def _type(el, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(Keys.BACKSPACE)
    el.send_keys(text)


def test_run_a_deployment_from_the_prefect_ui_and_find_it_in_mlflow(stack, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from infra.runs import find_by_flow_run

    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
    # 1. train/tiny's page (the deployments list pages through a dozen entries); open its custom-run form
    deployment_url = f"{stack['prefect']}/deployments/deployment/{_deployment_id(stack['prefect'], 'train/tiny')}"
    browser.get(deployment_url)
    _wait(lambda: "tiny" in body(), 120, "the deployment page")
    earlier = _flow_runs_of(stack["prefect"], deployment_url.split("/")[-1])
    browser.get(deployment_url + "/run")
    _wait(lambda: "Iterations (Optional)" in body(), 120, "the run form")
    # 2. change parameters in the form: one iteration, runs in the test's folder, a recognisable run name
    name = f"browser-{uuid.uuid4().hex[:8]}"
    _type(browser.find_element(By.CSS_SELECTOR, ".flow-run-name-input input"), name)
    _type(_field(browser, "Iterations (Optional)"), "1")
    _type(_field(browser, "Dir (Optional)"), str(stack["runs"]))
    browser.find_element(By.XPATH, "//button[@type='submit' and normalize-space()='Submit']").click()

    def run_id():
        """The UI opens the new flow run or toasts a link to it; the toast can vanish between two polls on a
        loaded machine, so the deployment's new flow run is also looked up in the server."""
        if "/runs/flow-run/" in browser.current_url:
            return browser.current_url.split("?")[0].rstrip("/").split("/")[-1]
        links = browser.find_elements(By.CSS_SELECTOR, "a[href*='/runs/flow-run/']")
        if links and (href := links[0].get_attribute("href")):
            return href.split("?")[0].rstrip("/").split("/")[-1]
        new = _flow_runs_of(stack["prefect"], deployment_url.split("/")[-1]) - earlier
        return new.pop() if len(new) == 1 else None

    try:
        flow_run_id = _wait(run_id, 180, "the flow run the form submitted")
    except AssertionError as e:
        raise AssertionError(f"{e}; the page said:\n{body()[:2000]}") from None
    browser.get(f"{stack['prefect']}/runs/flow-run/{flow_run_id}")

    # 3. the worker picks it up; the state badge in the page heading turns Completed (the page polls)
    def state():
        badges = browser.find_elements(By.CSS_SELECTOR, ".page-heading .state-badge")
        text = badges[0].text.strip() if badges else ""
        return text if text in ("Completed", "Failed", "Crashed", "Cancelled") else None

    assert _wait(state, 900, "the flow run to finish", 5) == "Completed", body()[:3000]
    browser.save_screenshot(str(tmp_path / "prefect-flow-run.png"))
    assert (tmp_path / "prefect-flow-run.png").stat().st_size > 10_000
    run_dir = find_by_flow_run(stack["runs"], flow_run_id)
    assert run_dir is not None, f"no run folder of flow run {flow_run_id} in {stack['runs']}"
    cfg = (run_dir / "config.yaml").read_text()
    assert "iterations: 1\n" in cfg and f"dir: {stack['runs']}" in cfg  # the form's values reached the run
    browser.refresh()  # the flow run renamed itself once its run id was known
    _wait(lambda: f"train-mathchat-{run_dir.name}" in body(), 60, "the flow run's name")
    # 4. the MLflow UI shows that run's metrics
    from mlflow.tracking import MlflowClient

    mlflow_id = (run_dir / "mlflow_run_id").read_text().strip()
    exp = MlflowClient(tracking_uri=f"sqlite:///{stack['runs']}/mlflow.db").get_run(mlflow_id).info.experiment_id
    browser.get(f"{stack['mlflow']}/#/experiments/{exp}/runs/{mlflow_id}")
    _wait(lambda: run_dir.name in body() and "Finished" in body(), 120, "the finished MLflow run's page")
    _wait(lambda: "success_rate" in body(), 60, "the run's metrics")
    browser.save_screenshot(str(tmp_path / "mlflow-run.png"))
    # 5. the registry: the run's final solver is a version of `tiny-solver`, with the alias `best`
    browser.get(f"{stack['mlflow']}/#/models/tiny-solver")
    _wait(lambda: run_dir.name in body(), 120, "the registered model's versions")
    assert "best" in body() and "teamrl.eval_success" in body(), body()[:2000]
    # 6. one held-out episode as a trace: its agents' turns, and the coach's verdict beside a turn
    from infra.traces import trace_ids

    _, trace = sorted(trace_ids(f"sqlite:///{stack['runs']}/mlflow.db", exp, run_dir, 1, "eval").items())[0]
    browser.get(f"{stack['mlflow']}/#/experiments/{exp}/traces?selectedEvaluationId={trace}")  # flows.inspection
    _wait(lambda: "solver (turn 0)" in body(), 120, "the trace's spans")
    assert "solver (turn 0)" in body() and "verifier (turn 2)" in body(), body()[:3000]
    browser.find_element(By.XPATH, "//*[normalize-space()='executor (turn 1)']").click()
    _wait(lambda: "coach" in body() and "python" in body(), 60, "the turn's coach feedback and its tool")
    browser.save_screenshot(str(tmp_path / "mlflow-trace.png"))
    assert (tmp_path / "mlflow-trace.png").stat().st_size > 10_000


@pytest.mark.timeout(2400)  # four tiny runs, two at a time, on a machine the rest of the suite may share
def test_run_the_sweep_deployment_from_the_prefect_ui_and_see_its_runs_under_it(stack, browser, tmp_path):
    """sweep/tiny-sweep from its form, its runs sent to the work pool (deployment train/sweep-run, two at a
    time): the parent flow run completes, and its page lists the four train flow runs as its sub-flow runs."""
    import json
    import urllib.request

    from selenium.webdriver.common.by import By

    body = lambda: browser.find_element(By.TAG_NAME, "body").text  # noqa: E731
    deployment_id = _deployment_id(stack["prefect"], "sweep/tiny-sweep")
    earlier = _flow_runs_of(stack["prefect"], deployment_id)
    browser.get(f"{stack['prefect']}/deployments/deployment/{deployment_id}/run")
    _wait(lambda: "Runs Dir (Optional)" in body(), 120, "the sweep's run form")
    runs, records = stack["runs"] / "sweep", tmp_path / "records"
    _type(_field(browser, "Runs Dir (Optional)"), str(runs))
    _type(_field(browser, "Records (Optional)"), str(records))
    _type(_field(browser, "Deployment (Optional)"), "train/sweep-run")
    _type(_field(browser, "Concurrency (Optional)"), "2")
    browser.find_element(By.XPATH, "//button[@type='submit' and normalize-space()='Submit']").click()

    def new_run():
        new = _flow_runs_of(stack["prefect"], deployment_id) - earlier
        return new.pop() if len(new) == 1 else None

    parent = _wait(new_run, 180, "the sweep's flow run")

    def state():
        with urllib.request.urlopen(f"{stack['prefect']}/api/flow_runs/{parent}", timeout=30) as resp:
            name = (json.load(resp).get("state") or {}).get("name")
        return name if name in ("Completed", "Failed", "Crashed", "Cancelled") else None

    assert _wait(state, 2000, "the sweep to finish", 10) == "Completed"
    browser.get(f"{stack['prefect']}/runs/flow-run/{parent}")
    _wait(lambda: "sweep-tiny-sweep" in body() and "Completed" in body(), 120, "the sweep's flow run page")
    assert sorted(p.name for p in records.glob("*.csv")) == [
        "blind-s0.csv",
        "blind-s1.csv",
        "joint-s0.csv",
        "joint-s1.csv",
    ]
    assert "Subflow Runs" in body(), body()[:3000]
    # the four train flow runs the parent started on the pool are its sub-flow runs: each one's parent task run
    # belongs to the sweep's flow run (what the UI's Subflow Runs tab lists)
    names = [f"train-mathchat-tiny-sweep-{v}-s{s}" for s in (0, 1) for v in ("joint", "blind")]
    req = urllib.request.Request(
        f"{stack['prefect']}/api/flow_runs/filter",
        data=json.dumps({"flow_runs": {"name": {"any_": names}}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        children = json.load(resp)
    assert sorted(c["name"] for c in children) == sorted(names)
    assert all(c["state"]["name"] == "Completed" and c["parent_task_run_id"] for c in children)
    for c in children:
        with urllib.request.urlopen(f"{stack['prefect']}/api/task_runs/{c['parent_task_run_id']}", timeout=30) as r:
            assert json.load(r)["flow_run_id"] == parent
    browser.save_screenshot(str(tmp_path / "prefect-sweep.png"))
