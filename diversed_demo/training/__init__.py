"""Training an ensemble head with sequence-level REINFORCE plus an acceptance term.

Both language models are frozen; only the head trains. Rollouts come from the speculative decoder itself
(blocks of N drafts verified against nu_t = w_t·p_t + (1 − w_t)·q_t, with the serving N; a step's
rollouts decode as one batch), so they follow the law the head serves under for either kind of draft. At
every position where w_t decided the token we keep what the loss needs: the hidden states the head reads,
p_t(y_t), q_t(y_t) and TV(p_t, q_t). The loss then re-evaluates only the head:

    log π(y) = Σ_t log nu_t(y_t)
    loss = −mean_tokens(A · log nu_t(y_t)) − λ · mean_t(1 − w_t·TV_t)

with A = reward − the mean reward of the prompt's group of rollouts (the sample itself included, so
not leave-one-out), divided by the standard deviation of A over the batch: REINFORCE with a group
baseline and batch normalisation of the advantage, the two ingredients REINFORCE++ adds to plain
REINFORCE (no critic, no ratio clipping). Minimising −λ·(1 − w·TV) lowers w where TV > 0, which raises
acceptance. With `target_acceptance` set, λ is instead the multiplier of an augmented Lagrangian for
"mean acceptance = target": the loss gains (ρ/2)·(mean(1 − w·TV) − target)² and
λ ← max(0, λ + ρ·(target − acceptance)) after each step (see multiplier_update for why).

The fidelity reward is a sum of per-token terms log p_t(y_t), and the part each w_t decides directly
has a closed form: E_{y~nu_t}[log p_t(y)] = −w_t·H(p_t) − (1 − w_t)·CE(q_t, p_t). Its
exact gradient joins the loss with weight `dense_fidelity`, giving every position its own noiseless
credit; REINFORCE still carries what a token does to the rest of the sequence. The per-token optimum
then raises w_t exactly where the draft's tokens cost the most fidelity per unit of acceptance,
CE − H > λ·TV, which a static w cannot do.

config: the run's settings; rollouts: on-policy decodes; objective: the loss; warm_start: the offline fit
before RL; loop: train_head; diagnostics: what a head learned; optim: optimiser and checkpoints.
"""
