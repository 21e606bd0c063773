"""Parameters are declared once, on the models (models/config.py), and everything else derives
from them: the pipeline sections, the flow signature and its UI help, the configs a stage builds."""

import inspect
from dataclasses import dataclass
from typing import Annotated

import pytest
from lexiflow.flows.params import PipelineParams
from lexiflow.flows.pipeline import pipeline
from lexiflow.models.config import check, from_section, parameters
from lexiflow.models.errors import ParameterError
from lexiflow.models.glove import GloVeConfig
from lexiflow.models.lm.rnn import RNNConfig
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.lm.transformer import TransformerConfig
from lexiflow.tasks.params import GloVeParams, NeuralLMParams, section
from prefect.utilities.callables import parameter_schema
from pydantic import Field


def test_sections_have_the_models_defaults_and_bounds():
    assert GloVeParams().model_dump(exclude={"continue_from"}) == {
        name: default for name, (_, default) in parameters(GloVeConfig).items()}
    neural = NeuralLMParams()
    # the same defaults the library uses: one declaration (dropout, lr and warm-up once differed)
    assert (neural.dropout, neural.lr, neural.warmup_steps) == (RNNConfig(10).dropout, TrainConfig().lr,
                                                                TrainConfig().warmup_steps)
    with pytest.raises(ValueError, match="less than 1"):
        NeuralLMParams(dropout=1.0)
    with pytest.raises(ParameterError, match="RNNConfig.dropout=1.0"):
        RNNConfig(10, dropout=1.0).validate()  # the Python user meets the pipeline's bound


def test_a_stage_builds_the_config_the_section_describes():
    p = NeuralLMParams(d_model=32, n_heads=2, lr=0.01, max_len=16)
    config = from_section(TransformerConfig, p, vocab_size=50)
    assert (config.d_model, config.n_heads, config.max_len, config.vocab_size) == (32, 2, 16, 50)
    assert from_section(TrainConfig, p, checkpoint_dir="x").lr == 0.01


def test_the_flow_signature_and_ui_help_derive_from_pipeline_params():
    signature = inspect.signature(pipeline.fn)
    assert list(signature.parameters) == list(PipelineParams.model_fields)
    assert all(p.default == PipelineParams.model_fields[n].default for n, p in signature.parameters.items())
    schema = parameter_schema(pipeline.fn).model_dump()
    assert schema["properties"]["glove"]["description"] == PipelineParams.model_fields["glove"].description
    # the nested form carries the model's own description
    glove = schema["definitions"]["GloVeParams"]["properties"]["spectrum_power"]
    assert glove["description"].startswith("The vectors' singular values")


def test_two_sources_declaring_one_name_differently_are_refused():
    @dataclass
    class A:
        width: Annotated[int, Field(ge=1, description="Width.")] = 4

    @dataclass
    class B:
        width: Annotated[int, Field(ge=1, description="Width.")] = 8

    assert list(section("Ok", A, A).model_fields) == ["width"]
    with pytest.raises(TypeError, match="Clash.width"):
        section("Clash", A, B)


def test_check_names_the_field_and_the_rule():
    with pytest.raises(ParameterError, match=r"GloVeConfig.optimizer='sgd' is invalid"):
        check(GloVeConfig(optimizer="sgd"))
