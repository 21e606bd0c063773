"""models.attention and models.transformer_blocks: known answers from the notes, masks, shapes."""

import math

import pytest
import torch
from lexiflow.models.attention import (
    AdditiveAttention,
    DotAttention,
    GeneralAttention,
    MultiHeadAttention,
    causal_mask,
    make_score_attention,
    masked_softmax,
    scaled_dot_product_attention,
)
from lexiflow.models.errors import ParameterError
from lexiflow.models.transformer_blocks import BlockConfig, Decoder, DecoderLayer, Embeddings, Encoder, EncoderLayer


def test_notes_exercise_001_softmax_of_scaled_scores_times_v():
    # 001's worked exercise: Q K^T = [[-6, -3], [4, 2]], d_k = 2, scaled by 1/d_k (the exercise's choice)
    # to A = [[-3, -1.5], [2, 1]]; softmax row by row; times V = [[2, -5], [-1, 1]].
    q = torch.tensor([[-3.0, 0.0], [2.0, 0.0]])
    k = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # q k^T = [[-6, -3], [4, 2]]
    v = torch.tensor([[2.0, -5.0], [-1.0, 1.0]])
    out, w = scaled_dot_product_attention(q, k, v, scale=1 / 2)
    e = math.exp
    expected_w = torch.tensor([[e(-3) / (e(-3) + e(-1.5)), e(-1.5) / (e(-3) + e(-1.5))],
                               [e(2) / (e(2) + e(1)), e(1) / (e(2) + e(1))]])
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)
    # default scale is 1/sqrt(d_k)
    _, w_default = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w_default, torch.softmax(torch.tensor([[-6.0, -3.0], [4.0, 2.0]]) / math.sqrt(2), -1))


def test_notes_quiz_002_masked_alpha_22_is_one_half():
    # 002's quiz: scaled scores q_i.k_j/sqrt(d_k) below; in masked attention alpha_{2,2} = 0.5 (answer B):
    # row 2 sees keys 1 and 2 only, both scored 1.
    scores = torch.tensor([[1.0, 0, -1, -1], [1, 1, -1, 0], [0, 1, 1, -1], [-1, -1, 2, 1]])
    # realise the scores as q k^T with k = I and d_k = 4 (scale 1/sqrt(4) undone by doubling q)
    q, k = scores * 2, torch.eye(4)
    _, w = scaled_dot_product_attention(q, k, torch.eye(4), causal=True)
    assert w[1, 1].item() == pytest.approx(0.5)
    assert w[1, 0].item() == pytest.approx(0.5)
    assert torch.all(w.triu(1) == 0)
    e = math.e
    assert w[2, 2].item() == pytest.approx(e / (1 + 2 * e))  # row 3 sees scores [0, 1, 1]
    assert w[0, 0].item() == 1.0


def test_fully_masked_row_gives_zero_weights_and_output_not_nan():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2] = False  # query 2 of batch 1 may attend to nothing
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert torch.all(w[1, 2] == 0) and torch.all(out[1, 2] == 0)
    torch.testing.assert_close(w.sum(-1)[0], torch.ones(3))
    # the multi-head module, fused path and weights path alike
    mha = MultiHeadAttention(4, 2).eval()
    key_mask = torch.tensor([[True] * 5, [False] * 5])  # batch 1 has no real key at all
    for need in (False, True):
        y, _ = mha(q, k, mask=key_mask, need_weights=need)
        assert torch.isfinite(y).all()


def test_mask_broadcasts_and_masked_keys_get_zero_weight():
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)
    pad = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])[:, None, None, :]  # (B, 1, 1, T_k)
    out, w = scaled_dot_product_attention(q, k, v, pad)
    assert w.shape == (2, 2, 3, 6)
    assert torch.all(w[0, :, :, 4:] == 0)
    out_trunc, w_trunc = scaled_dot_product_attention(q[:1], k[:1, :, :4], v[:1, :, :4])
    torch.testing.assert_close(out[:1], out_trunc)
    torch.testing.assert_close(w[:1, :, :, :4], w_trunc)


def test_causal_mask_aligns_at_the_end_for_a_longer_key_sequence():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert masked_softmax(torch.zeros(1, 3), torch.tensor([[True, False, True]])).tolist() == [[0.5, 0.0, 0.5]]


def test_score_functions_on_hand_computed_scores():
    s = torch.tensor([[1.0, 2.0]])  # decoder state (B=1, d=2)
    h = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # encoder states (B=1, T=3, d=2)
    ctx, w = DotAttention()(s, h)  # scores s.h_j = [1, 2, 3]
    expected = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), -1)
    torch.testing.assert_close(w[0], expected)
    torch.testing.assert_close(ctx[0], expected @ h[0])  # c = sum_j alpha_j h_j

    gen = GeneralAttention(2, 2)
    with torch.no_grad():
        gen.W.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0]]))  # s^T W h: W h_j = [2h1, -h2]
    _, w = gen(s, h)  # scores: [2, -2, 0]
    torch.testing.assert_close(w[0], torch.softmax(torch.tensor([2.0, -2.0, 0.0]), -1))

    add = AdditiveAttention(2, 2, hidden_size=1)
    with torch.no_grad():
        add.W.weight.copy_(torch.tensor([[1.0, 0.0]]))  # W s = s_1 = 1
        add.U.weight.copy_(torch.tensor([[0.0, 1.0]]))  # U h = h_2
        add.U.bias.zero_()
        add.v.weight.copy_(torch.tensor([[2.0]]))
    _, w = add(s, h)  # scores: 2 tanh(1 + h_j2) = 2 tanh([1, 2, 2])
    torch.testing.assert_close(w[0], torch.softmax(2 * torch.tanh(torch.tensor([1.0, 2.0, 2.0])), -1))

    # masked key: zero weight; a (B, T_q, d) query batch gives the per-step answers
    ctx_m, w_m = DotAttention()(s, h, mask=torch.tensor([[True, True, False]]))
    assert w_m[0, 2] == 0
    ctx2, w2 = DotAttention()(torch.stack([s, s * 0], 1), h)
    torch.testing.assert_close(w2[0, 0], expected)
    torch.testing.assert_close(w2[0, 1], torch.full((3,), 1 / 3))


def test_make_score_attention_rejects_bad_choices():
    with pytest.raises(ParameterError, match="dot"):
        make_score_attention("dot", 4, 8)
    with pytest.raises(ParameterError, match="attention='cosine'"):
        make_score_attention("cosine", 4, 4)
    assert isinstance(make_score_attention("additive", 4, 8), AdditiveAttention)


def test_multi_head_attention_equals_per_head_formula():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x, mem = torch.randn(3, 4, 8), torch.randn(3, 6, 8)
    y, w = mha(x, mem, need_weights=True)
    y_fused, _ = mha(x, mem)
    torch.testing.assert_close(y, y_fused, atol=1e-5, rtol=1e-5)
    # by hand: head i uses columns [4i, 4i+4) of the projections
    q, k, v = mha.q_proj(x), mha.k_proj(mem), mha.v_proj(mem)
    heads = []
    for i in range(2):
        sl = slice(4 * i, 4 * i + 4)
        a = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / 2.0, -1)
        torch.testing.assert_close(w[:, i], a)
        heads.append(a @ v[..., sl])
    torch.testing.assert_close(y, mha.out_proj(torch.cat(heads, -1)), atol=1e-5, rtol=1e-5)


def test_projections_start_as_torch_multihead_attention():
    # torch's _reset_parameters: xavier-uniform over the stacked in-projection [W^Q; W^K; W^V], zero biases;
    # the same seed must give the same weights (nn.Linear's default init gives neither)
    ours, ref = MultiHeadAttention(16, 4), torch.nn.MultiheadAttention(16, 4)
    torch.manual_seed(3)
    ours.reset_parameters()
    torch.manual_seed(3)
    ref._reset_parameters()
    torch.testing.assert_close(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]),
                               ref.in_proj_weight, rtol=0, atol=0)
    for proj in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
        assert torch.count_nonzero(proj.bias) == 0
    fresh = MultiHeadAttention(16, 4)  # construction runs the same init
    assert torch.count_nonzero(fresh.q_proj.bias) == 0 and fresh.q_proj.weight.abs().max() <= (6 / 64) ** 0.5


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_decoder_padding_and_causality(norm, activation):
    torch.manual_seed(1)
    c = BlockConfig(d_model=8, n_heads=2, d_ff=16, dropout=0.0, norm=norm, activation=activation)
    enc, dec = Encoder(c, 2).eval(), Decoder(c, 2).eval()
    src = torch.randn(2, 5, 8)
    pad = torch.tensor([[True] * 3 + [False] * 2, [True] * 5])
    memory = enc(src, pad)
    alone = enc(src[:1, :3])
    torch.testing.assert_close(memory[:1, :3], alone, atol=1e-5, rtol=1e-5)  # padding changes nothing
    tgt = torch.randn(2, 4, 8)
    y, w = dec(tgt, memory, pad, need_weights=True)
    assert w.shape == (2, 4, 5) and torch.all(w[0, :, 3:] == 0)
    y_alone, _ = dec(tgt[:1], alone)
    torch.testing.assert_close(y[:1], y_alone, atol=1e-5, rtol=1e-5)
    # causal: changing a later target position leaves earlier outputs unchanged
    tgt2 = tgt.clone()
    tgt2[:, 3] += torch.randn(2, 8)  # not a constant shift, which LayerNorm would erase
    y2, _ = dec(tgt2, memory, pad)
    torch.testing.assert_close(y[:, :3], y2[:, :3], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(y[:, 3], y2[:, 3])


def test_post_norm_is_layernorm_of_residual_sum():
    torch.manual_seed(2)
    c = BlockConfig(d_model=4, n_heads=1, d_ff=8, dropout=0.0, norm="post")
    layer = EncoderLayer(c).eval()
    x = torch.randn(1, 3, 4)
    a, _ = layer.attn(x)
    h = layer.sub_attn.norm(x + a)
    expected = layer.sub_ffn.norm(h + layer.ffn(h))
    torch.testing.assert_close(layer(x)[0], expected)
    assert isinstance(DecoderLayer(c).ffn[1], torch.nn.ReLU)


def test_embeddings_and_config_errors():
    emb = Embeddings(10, 4, max_len=6)
    assert emb(torch.zeros(2, 6, dtype=torch.long)).shape == (2, 6, 4)
    with pytest.raises(ParameterError, match="max_len=6"):
        emb(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ParameterError, match="positional"):
        Embeddings(10, 4, 6, positional="rotary")
    with pytest.raises(ParameterError, match="norm="):
        BlockConfig(norm="sandwich").validate()
    with pytest.raises(ParameterError, match="divisible"):
        BlockConfig(d_model=6, n_heads=4).validate()


def test_weights_come_back_only_when_asked_whichever_path_runs():
    """On the CPU, training with dropout takes the explicit attention (it draws the dropout faster), which
    computes the weights anyway: they are returned only with `need_weights`, as on every other path."""
    x = torch.randn(2, 5, 8)
    mha = MultiHeadAttention(8, 2, dropout=0.1)
    for training in (True, False):
        mha.train(training)
        assert mha(x)[1] is None
        assert mha(x, need_weights=True)[1].shape == (2, 2, 5, 5)
