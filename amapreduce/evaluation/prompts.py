"""The official judge prompts, verbatim, so an LLM judge sees what the official scorer sends.

Sources (MIT): ByteDance-Seed/WideSearch `src/evaluation/metric_utils.py` (`eval_column_prompt`,
`primary_key_preprocess_prompt`) and the DeepWideSearch `metric_utils.py` entity prompt. They are
`str.format` templates; doubled braces are literal.
"""

from __future__ import annotations

__all__ = ["COLUMN_JUDGE_PROMPT", "ENTITY_JUDGE_PROMPT", "KEY_ALIGN_PROMPT"]

KEY_ALIGN_PROMPT = """Your task is to align two vocabularies. The inputs are the vocabulary to be aligned and the reference vocabulary respectively. Note that you need to perform semantic alignment (not positional alignment). If two strings are exactly the same, they must correspond to each other. These two strings are supposed to represent the same entity, with differences only in the expression forms and formats.


The vocabulary to be aligned is as follows:
{response}

The reference vocabulary is as follows:
{reference}

The alignment rules are as follows:
List the values in the vocabulary to be aligned one by one. If there is a value in the reference vocabulary that has the same meaning as this value, `transform` should be represented as the value from the reference vocabulary; otherwise, `transform` should be represented as the original value from the vocabulary to be aligned.

Note that `origin` must be taken from the vocabulary to be aligned keeping the original format, and `transform` must be taken from the reference vocabulary. For example: Some words in the vocabulary to be aligned might be the words in the reference vocabulary with Markdown formatting added, keep the to be aligned format in `origin` and the reference format in `transform`.

For the `origin`, first find the `transform` that is the closest in meaning and then judge whether they correspond to each other. Those entities not correspond to each other could not output.

Please output the alignment results in the following format:
```json
{{
    "origin_str1": "transform_str1",
    "origin_str2": "transform_str2"
}}
```
"""  # noqa: E501

COLUMN_JUDGE_PROMPT = """You are an expert in grading answers. Your task is to score the responses to a certain question. Below, you will be provided with a set of standard answers, a set of responses to be graded, and specific grading criteria.

Each answer and each response has an idx. Please score each pair of answers and responses in this set according to the following methods:
1. The scoring range is from 0 to 1. A score of 1 indicates a completely correct answer. For deduction items, please refer to the specific grading criteria section.
2. After reading the standard answers, responses to be graded, and grading criteria, please first analyze and judge them item by item according to the grading criteria.
3. The score can only be an integer of 0 or 1.
4. After the analysis and judgment, please provide the final scoring results. Each pair should have a score. Output in Markdown JSON format, as shown below:
```json
{{
    "idx_xxx": score,
    "idx_yyy": score,
    ...
}}
```

====== criterion-start ======
{criterion}
====== criterion-end ======

====== response-start ======
{response}
====== response-end ======

Now start scoring. Please make sure to analyze each item step by step before providing the final scoring results.

"""  # noqa: E501

ENTITY_JUDGE_PROMPT = """你是一个专业的人工标注人员，现在需要你仔细检查：对于查询 entity ({entity}) 相关信息的 question，该 question 对应的 response 中是否正确猜测对了entity ({entity}) 的内容。

# Question
{question}

# 针对该查询问题的 Entity
{entity}

# Response
{response}

# 输出格式
请你直接输出你的判断结果，如果你认为 response 中的信息表明正确猜测对了 entity——{entity}，请你直接输出 Yes，否则输出 No。不要添加任务无关的解释信息，只输出 Yes 或者 No。
"""  # noqa: E501
